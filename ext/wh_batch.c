/* Batch layout and fill shared by both batch rings (wh_batch.h). */
#include "wh_batch.h"

#include <stdio.h>
#include <string.h>

bool wh_batch_layout(wh_batch_t *b, const wh_sample_meta_t *m, uint32_t n, uint32_t want,
                     wh_err_t *err) {
    uint64_t off = 0, part;
    for (int f = 0; f < m->nfields; f++) {
        b->meta[f] = m->f[f];
        b->off[f] = off;
        if (!(want & (1u << f))) continue;
        if (!wh_mul_ok(m->f[f].nbytes, n, &part) || part > WH_SAMPLE_MAX_BYTES * 64 ||
            !wh_add_ok(off, WH_ALIGN_UP(part), &off))
            return wh_err_set(err, WH_E_INVALID, "batch size overflows");
    }
    b->n = n;
    b->pad_off = off;
    b->gen_off = off + WH_ALIGN_UP(n);
    b->pos_off = b->gen_off + WH_ALIGN_UP(8 * (uint64_t)n);
    b->pv_off = b->pos_off + WH_ALIGN_UP(8 * (uint64_t)n);
    b->size = b->pv_off + WH_ALIGN_UP(8 * (uint64_t)n);
    return true;
}

void wh_batch_at_array(void *ctx, uint32_t i, uint32_t *pos, bool *pad) {
    *pos = ((const uint32_t *)ctx)[i];
    *pad = false;
}

typedef struct {
    const wh_batch_fill_t *rq;
    wh_batch_t *b;
    wh_batch_stats_t *stats;
    char *data;
    uint32_t i;
    const wh_read_at_t *at; /* the attempt in progress (for messages) */
} wh__bfill_t;

static void wh__shape_str(const wh_field_meta_t *f, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "%s(", wh_dtype_name(f->dtype));
    for (int d = 0; d < f->ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, d ? ", %lld" : "%lld", (long long)f->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, ")");
}

static bool wh__bdest(void *ctx, const wh_sample_meta_t *m, void **dst, wh_err_t *err) {
    wh__bfill_t *c = ctx;
    wh_batch_t *b = c->b;
    uint32_t want = c->rq->want;
    if (!c->data) {
        if (!wh_batch_layout(b, m, c->rq->n, want, err)) return false;
        if (!(c->data = c->rq->mem(c->rq->mem_ctx, b, err))) return false;
    } else {
        if (c->rq->check && !c->rq->check(c->rq->mem_ctx, err)) return false;
        for (int f = 0; f < m->nfields; f++) {
            if (!(want & (1u << f)) || wh_field_meta_same(&m->f[f], &b->meta[f])) continue;
            char x[160], y[160];
            wh__shape_str(&m->f[f], x, sizeof x);
            wh__shape_str(&b->meta[f], y, sizeof y);
            char name[WH_MAX_NAME + 8];
            if (c->rq->schema)
                snprintf(name, sizeof name, "%s", c->rq->schema->names[f]);
            else
                snprintf(name, sizeof name, "#%d", f);
            c->stats->mismatch = true;
            c->stats->mismatch_gen = c->at->gen;
            c->stats->mismatch_pos = c->at->pos;
            return wh_err_set(err, WH_E_INVALID,
                              "field '%s': sample at position %u of generation %llu is %s but "
                              "the batch's first sample is %s; samples stacked in one batch "
                              "need one shape (use WireheadIterableDataset with a collate_fn "
                              "for ragged samples)",
                              name, c->at->pos, (unsigned long long)c->at->gen, x, y);
        }
    }
    for (int f = 0; f < m->nfields; f++)
        if (want & (1u << f)) dst[f] = c->data + b->off[f] + (uint64_t)c->i * m->f[f].nbytes;
    return true;
}

bool wh_batch_fill(const wh_batch_fill_t *rq, uint64_t gen, wh_batch_t *b, void **data,
                   wh_batch_stats_t *stats, wh_err_t *err) {
    memset(stats, 0, sizeof *stats);
    stats->gen = gen;
    *data = NULL;
    if (rq->n < 1) return wh_err_set(err, WH_E_INVALID, "a batch needs at least one row");
    wh_read_at_t at;
    wh__bfill_t c = {rq, b, stats, NULL, 0, &at};
    for (uint32_t i = 0; i < rq->n; i++) {
        bool pad;
        memset(&at, 0, sizeof at);
        at.gen = gen;
        at.strict = rq->strict;
        rq->at(rq->at_ctx, i, &at.pos, &pad);
        c.i = i;
        wh_sample_meta_t meta;
        bool ok =
            wh_store_read_sample(rq->st, &at, rq->timeout_s, rq->stop, wh__bdest, &c, &meta, err);
        stats->gone += at.gone;
        if (at.corrupt) {
            stats->corrupt += at.corrupt;
            memcpy(stats->last_skip, at.last_skip, sizeof at.last_skip);
        }
        if (at.gen > stats->gen) stats->gen = at.gen;
        if (!ok) {
            *data = c.data;
            return false;
        }
        gen = at.gen;
        char *base = c.data;
        base[b->pad_off + i] = pad || at.pad;
        int64_t g64 = (int64_t)gen, p64 = at.pos, v64 = (int64_t)meta.params_version;
        memcpy(base + b->gen_off + 8 * (uint64_t)i, &g64, 8);
        memcpy(base + b->pos_off + 8 * (uint64_t)i, &p64, 8);
        memcpy(base + b->pv_off + 8 * (uint64_t)i, &v64, 8);
        if (rq->sums)
            for (int f = 0; f < meta.nfields; f++)
                rq->sums[(uint64_t)i * WH_MAX_FIELDS + f] =
                    rq->want & (1u << f) ? meta.f[f].checksum : 0;
    }
    stats->gen = gen;
    *data = c.data;
    return true;
}
