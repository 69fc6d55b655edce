/* The hand-over of positions (wh_cuda.h, wh_gpu_copy_slot_rows): a ring
 * slot's batch whose large rows a worker left in the store, copied from
 * the slot and from this process's views of the store. */
#include "wh_cuda_int.h"

/* Keeps a claimed slot and its rows' store views until the copy's event. */
typedef struct {
    wh_buf_t buf; /* over the slot's bytes */
    wh_buf_t *held;
    uint32_t n;
    wh_buf_t *views[];
} wh__rowhold_t;

static void wh__rowhold_release(wh_buf_t *b) {
    wh__rowhold_t *h = b->owner;
    for (uint32_t i = 0; i < h->n; i++) wh_buf_unref(h->views[i]);
    wh_buf_unref(h->held);
    free(h);
}

/* Each row's generation, position and padding flag as the slot names
 * them: read out of shared memory once, and checked, before any use. */
typedef struct {
    uint64_t *gen;
    uint32_t *pos;
    uint8_t *pad;
} wh__rows_at_t;

typedef struct {
    const wh__rows_at_t *at;
    wh_gpu_t *g;
    wh_buf_t *h; /* page-locked memory of the batch read again */
} wh__reread_t;

static void wh__reread_at(void *ctx, uint32_t i, uint32_t *pos, bool *pad) {
    const wh__reread_t *c = ctx;
    *pos = c->at->pos[i];
    *pad = c->at->pad[i] != 0;
}

static void *wh__reread_mem(void *ctx, const wh_batch_t *b, wh_err_t *err) {
    wh__reread_t *c = ctx;
    if (c->h && c->h->size >= b->size) return c->h->data;
    wh_buf_unref(c->h);
    c->h = wh_gpu_pinned(c->g, b->size ? b->size : 1, err);
    return c->h ? c->h->data : NULL;
}

/* The batch read again in this process, as the worker read it: the rows'
 * positions and padding from the slot, from the first row's generation on
 * (a reclaimed one moves to the newest), checked; one copy. */
static wh_buf_t *wh__rows_reread(wh_gpu_t *g, const wh__rows_at_t *at, const wh_gpu_rows_t *rq,
                                 wh_err_t *err) {
    wh__reread_t c = {at, g, NULL};
    const wh_store_config_t *cfg = wh_store_config(rq->st);
    wh_batch_fill_t f = {0};
    f.st = rq->st;
    f.schema = &cfg->schema;
    f.n = rq->n;
    f.want = rq->want;
    f.timeout_s = rq->timeout_s;
    f.strict = rq->strict;
    f.at = wh__reread_at;
    f.at_ctx = &c;
    f.mem = wh__reread_mem;
    f.mem_ctx = &c;
    f.ignore_fields = rq->ignore_fields;
    f.ignore_int = rq->ignore_int;
    f.ignore_float = rq->ignore_float;
    wh_batch_t b;
    void *data;
    wh_batch_stats_t st;
    wh_buf_t *dev = NULL;
    bool ok = wh_batch_fill(&f, at->gen[0], &b, &data, &st, err);
    for (int k = 0; ok && k < rq->nfields; k++) {
        if (!(rq->want & (1u << k)) || (b.off[k] == rq->off[k] && b.meta[k].nbytes == rq->row[k]))
            continue;
        ok = wh_err_set(err, WH_E_INVALID,
                        "field '%s': generation %llu holds samples of %llu bytes where the "
                        "batch's worker read %llu; samples stacked in one batch need one shape",
                        cfg->schema.names[k], (unsigned long long)st.gen,
                        (unsigned long long)b.meta[k].nbytes, (unsigned long long)rq->row[k]);
    }
    if (ok && b.size != rq->size)
        ok = wh_err_set(err, WH_E_INVALID, "the batch read again has %llu bytes, not %llu",
                        (unsigned long long)b.size, (unsigned long long)rq->size);
    if (ok) dev = wh__gpu_copy(g, c.h, b.size, NULL, err);
    if (dev) {
        pthread_mutex_lock(&g->mu);
        g->stats.host_copy_bytes += st.host_bytes;
        g->stats.rereads++;
        pthread_mutex_unlock(&g->mu);
    }
    wh_buf_unref(c.h); /* the stage holds it until the copy's event */
    return dev;
}

/* Views of every row's large fields, by the generation and position the
 * slot names; false (nothing held) when one is not the sample the worker
 * read any more, or an error other than a read's (*fatal). */
static bool wh__rows_view(const wh_gpu_rows_t *rq, const wh__rows_at_t *at, wh__rowhold_t *hold,
                          const char **src, bool *fatal, wh_err_t *err) {
    for (uint32_t i = 0; i < rq->n; i++) {
        uint64_t known[WH_MAX_FIELDS] = {0};
        memcpy(known, rq->sums + (size_t)i * (size_t)rq->nfields, (size_t)rq->nfields * 8);
        wh_sample_meta_t m;
        wh_err_t e = {0};
        if (!wh_store_view_known(rq->st, at->gen[i], at->pos[i], known, &hold->views[i], &m, &e)) {
            *fatal = e.code == WH_E_SYS || e.code == WH_E_INTERNAL;
            if (*fatal && err) *err = e;
            return false;
        }
        hold->n = i + 1;
        for (int f = 0; f < rq->nfields; f++) {
            if (!(rq->direct & (1u << f))) continue;
            if (f >= m.nfields || m.f[f].checksum != known[f] || m.f[f].nbytes != rq->row[f])
                return false;
            src[(size_t)i * WH_MAX_FIELDS + f] = (const char *)hold->views[i]->data + m.f[f].offset;
        }
    }
    return true;
}

wh_buf_t *wh_gpu_copy_slot_rows(wh_gpu_t *g, wh_buf_t *held, const wh_gpu_rows_t *rq,
                                bool *direct_out, bool *reread, wh_err_t *err) {
    *direct_out = *reread = false;
    if (rq->n < 1 || rq->nfields < 1 || rq->nfields > WH_MAX_FIELDS || !(rq->direct & rq->want) ||
        (rq->direct & ~rq->want))
        return wh_err_set(err, WH_E_INVALID, "copy_slot: no fields left in the store"), NULL;
    wh_batch_t b;
    memset(&b, 0, sizeof b);
    b.n = rq->n;
    b.nfields = rq->nfields;
    b.direct = rq->direct;
    for (int f = 0; f < rq->nfields; f++) {
        b.off[f] = rq->off[f];
        b.meta[f].nbytes = rq->row[f];
    }
    b.pad_off = rq->pad_off;
    b.gen_off = rq->gen_off;
    b.pos_off = rq->pos_off;
    b.pv_off = rq->pv_off;
    b.size = rq->size;
    /* the layout comes from the handle: the blocks in order, inside the
     * batch, and the slot's part the size of the slot claimed */
    uint64_t end = 0;
    bool fits = true;
    for (int f = 0; f < rq->nfields && fits; f++) {
        uint64_t part;
        if (!(rq->want & (1u << f))) continue;
        fits = b.off[f] >= end && wh_mul_ok(b.meta[f].nbytes, b.n, &part) &&
               wh_add_ok(b.off[f], WH_ALIGN_UP(part), &end);
    }
    fits = fits && b.size <= WH_SAMPLE_MAX_BYTES * 64 && end <= b.size && b.pad_off <= b.size &&
           b.gen_off <= b.size && b.pos_off <= b.size && b.pv_off <= b.size && b.pad_off >= end &&
           b.gen_off >= b.pad_off + b.n && b.pos_off >= b.gen_off + 8 * (uint64_t)b.n &&
           b.pv_off >= b.pos_off + 8 * (uint64_t)b.n && b.size >= b.pv_off + 8 * (uint64_t)b.n &&
           b.size <= WH_SAMPLE_MAX_BYTES * 64;
    b.hsize = fits ? wh_batch_host_off(&b, b.size) : 0;
    if (!fits || b.hsize != held->size)
        return wh_err_set(err, WH_E_INVALID,
                          "copy_slot: a batch layout (%llu bytes, %llu in the slot) that does "
                          "not fit its %zu-byte slot",
                          (unsigned long long)b.size, (unsigned long long)b.hsize, held->size),
               NULL;
    const char *slot = held->data;
    wh__rows_at_t at = {malloc(rq->n * sizeof *at.gen), malloc(rq->n * sizeof *at.pos),
                        malloc(rq->n)};
    wh__rowhold_t *hold = calloc(1, sizeof *hold + rq->n * sizeof(wh_buf_t *));
    const char **src = calloc((size_t)rq->n * WH_MAX_FIELDS, sizeof *src);
    wh_buf_t *dev = NULL;
    bool ok = at.gen && at.pos && at.pad && hold && src;
    if (!ok) wh_err_set(err, WH_E_SYS, "out of memory");
    uint64_t goff = wh_batch_host_off(&b, b.gen_off), poff = wh_batch_host_off(&b, b.pos_off),
             padoff = wh_batch_host_off(&b, b.pad_off);
    for (uint32_t i = 0; ok && i < rq->n; i++) {
        int64_t gen, pos;
        memcpy(&gen, slot + goff + 8 * (uint64_t)i, 8);
        memcpy(&pos, slot + poff + 8 * (uint64_t)i, 8);
        at.pad[i] = (uint8_t)slot[padoff + i];
        if (gen <= 0 || pos < 0 || pos > (int64_t)UINT32_MAX)
            ok = wh_err_set(err, WH_E_CORRUPT,
                            "row %u of a ring slot names generation %lld "
                            "position %lld",
                            i, (long long)gen, (long long)pos);
        at.gen[i] = (uint64_t)gen;
        at.pos[i] = (uint32_t)pos;
    }
    bool fatal = !ok;
    if (ok) wh_store_set_dma_views(rq->st, true);
    if (!ok || !wh__rows_view(rq, &at, hold, src, &fatal, err)) {
        for (uint32_t i = 0; hold && i < hold->n; i++) wh_buf_unref(hold->views[i]);
        free(hold);
        free(src);
        if (!fatal) {
            *reread = true;
            dev = wh__rows_reread(g, &at, rq, err);
        }
        free(at.gen);
        free(at.pos);
        free(at.pad);
        return dev;
    }
    free(at.gen);
    free(at.pos);
    free(at.pad);
    b.src = src;
    b.views = hold->views;
    hold->held = held;
    wh_buf_ref(held);
    hold->buf.refs = 1;
    hold->buf.data = held->data;
    hold->buf.size = held->size;
    hold->buf.device_type = 1;
    hold->buf.release = wh__rowhold_release;
    hold->buf.owner = hold;
    /* both mappings registered, or the batch gathered into page-locked memory */
    wh_err_t e = {0};
    bool direct = !g->refused && wh__gpu_maps_for(g, &b, &e);
    if (!direct && !g->refused && e.code == WH_E_CUDA) {
        g->refused = true;
        wh_gpu_set_staged(g, e.message);
    }
    wh_buf_t *m = direct ? wh_ring_slot_map(held) : NULL;
    pthread_mutex_lock(&g->mu);
    wh__gpu_slots_sweep(g);
    if (direct && (g->slots_refused || !m || !wh__gpu_slot_registered(g, m, &e))) {
        direct = false;
        if (e.code == WH_E_CUDA && !g->slots_refused) {
            g->slots_refused = true;
            snprintf(g->stats.staged_why, sizeof g->stats.staged_why, "%s", e.message);
        }
    } else if (m && !direct) {
        wh_buf_unref(m);
    }
    pthread_mutex_unlock(&g->mu);
    if (!direct && e.code && e.code != WH_E_CUDA) {
        if (err) *err = e;
    } else if (direct) {
        dev = wh__gpu_copy(g, &hold->buf, b.size, &b, err);
        *direct_out = dev != NULL;
    } else {
        dev = wh__gpu_gather(g, &b, slot, held, err);
    }
    wh_buf_unref(&hold->buf); /* a queued copy holds its own reference */
    free(src);
    return dev;
}
