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
static wh_buf_t *wh__rows_reread(wh_gpu_t *g, wh_store_t *st, const wh__rows_at_t *at,
                                 const wh_batch_wire_t *w, wh_err_t *err) {
    wh__reread_t c = {at, g, NULL};
    const wh_store_config_t *cfg = wh_store_config(st);
    wh_batch_fill_t f = {0};
    f.st = st;
    f.schema = &cfg->schema;
    f.n = w->b.n;
    f.want = w->b.want;
    f.timeout_s = w->timeout_s;
    f.strict = w->strict;
    f.at = wh__reread_at;
    f.at_ctx = &c;
    f.mem = wh__reread_mem;
    f.mem_ctx = &c;
    f.ignore_fields = w->ignore_fields;
    f.ignore_int = w->ignore_int;
    f.ignore_float = w->ignore_float;
    wh_batch_t b;
    void *data;
    wh_batch_stats_t bs;
    wh_buf_t *dev = NULL;
    if (wh_batch_fill(&f, at->gen[0], &b, &data, &bs, err) &&
        wh_batch_same_layout(&w->b, &b, &cfg->schema, bs.gen, err))
        dev = wh__gpu_copy(g, c.h, b.size, NULL, err);
    if (dev) {
        pthread_mutex_lock(&g->mu);
        g->stats.host_copy_bytes += bs.host_bytes;
        g->stats.rereads++;
        pthread_mutex_unlock(&g->mu);
    }
    wh_buf_unref(c.h); /* the stage holds it until the copy's event */
    return dev;
}

/* Views of every row's large fields, by the generation and position the
 * slot names; false (nothing held) when one is not the sample the worker
 * read any more, or an error other than a read's (*fatal). */
static bool wh__rows_view(wh_store_t *st, const wh_batch_wire_t *w, const wh__rows_at_t *at,
                          wh__rowhold_t *hold, const char **src, bool *fatal, wh_err_t *err) {
    const wh_batch_t *b = &w->b;
    size_t nf = (size_t)b->nfields;
    for (uint32_t i = 0; i < b->n; i++) {
        uint64_t known[WH_MAX_FIELDS] = {0};
        memcpy(known, w->sums + (size_t)i * nf * 8, nf * 8);
        wh_sample_meta_t m;
        wh_err_t e = {0};
        if (!wh_store_view_known(st, at->gen[i], at->pos[i], known, &hold->views[i], &m, &e)) {
            *fatal = e.code == WH_E_SYS || e.code == WH_E_INTERNAL;
            if (*fatal && err) *err = e;
            return false;
        }
        hold->n = i + 1;
        for (int f = 0; f < b->nfields; f++) {
            if (!(b->direct & (1u << f))) continue;
            if (f >= m.nfields || m.f[f].checksum != known[f] || m.f[f].nbytes != b->meta[f].nbytes)
                return false;
            src[(size_t)i * WH_MAX_FIELDS + f] = (const char *)hold->views[i]->data + m.f[f].offset;
        }
    }
    return true;
}

wh_buf_t *wh_gpu_copy_slot_rows(wh_gpu_t *g, wh_buf_t *held, wh_store_t *st,
                                const wh_batch_wire_t *w, bool *direct_out, bool *reread,
                                wh_err_t *err) {
    *direct_out = *reread = false;
    if (!w->b.direct || w->b.hsize != held->size)
        return wh_err_set(err, WH_E_INVALID,
                          "copy_slot: no fields left in the store, or the layout read for "
                          "another slot"),
               NULL;
    wh_batch_t b = w->b;
    uint32_t n = b.n;
    const char *slot = held->data;
    wh__rows_at_t at = {malloc(n * sizeof *at.gen), malloc(n * sizeof *at.pos), malloc(n)};
    wh__rowhold_t *hold = calloc(1, sizeof *hold + n * sizeof(wh_buf_t *));
    const char **src = calloc((size_t)n * WH_MAX_FIELDS, sizeof *src);
    wh_buf_t *dev = NULL;
    bool ok = at.gen && at.pos && at.pad && hold && src;
    if (!ok) wh_err_set(err, WH_E_SYS, "out of memory");
    uint64_t goff = wh_batch_host_off(&b, b.gen_off), poff = wh_batch_host_off(&b, b.pos_off),
             padoff = wh_batch_host_off(&b, b.pad_off);
    for (uint32_t i = 0; ok && i < n; i++) {
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
    if (ok) wh_store_set_dma_views(st, true);
    if (!ok || !wh__rows_view(st, w, &at, hold, src, &fatal, err)) {
        for (uint32_t i = 0; hold && i < hold->n; i++) wh_buf_unref(hold->views[i]);
        free(hold);
        free(src);
        if (!fatal) {
            *reread = true;
            dev = wh__rows_reread(g, st, &at, w, err);
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
