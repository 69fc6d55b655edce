/* Batch layout and fill shared by both batch rings (wh_batch.h). */
#include "wh_batch.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "wh_fault.h"

/* The layout of n rows of fields of nbytes[f] bytes each (the wanted ones
 * only; b->direct and the direct fields' b->meta[f].nbytes already set). */
static bool wh__layout(wh_batch_t *b, int nfields, const uint64_t *nbytes, uint32_t n,
                       uint32_t want, wh_err_t *err) {
    uint64_t off = 0, part;
    for (int f = 0; f < nfields; f++) {
        b->off[f] = off;
        if (!(want & (1u << f))) continue;
        if (!wh_mul_ok(nbytes[f], n, &part) || part > WH_SAMPLE_MAX_BYTES * 64 ||
            !wh_add_ok(off, WH_ALIGN_UP(part), &off))
            return wh_err_set(err, WH_E_INVALID, "batch size overflows");
    }
    b->n = n;
    b->nfields = nfields;
    b->want = want;
    b->pad_off = off;
    b->gen_off = off + WH_ALIGN_UP(n);
    b->pos_off = b->gen_off + WH_ALIGN_UP(8 * (uint64_t)n);
    b->pv_off = b->pos_off + WH_ALIGN_UP(8 * (uint64_t)n);
    b->size = b->pv_off + WH_ALIGN_UP(8 * (uint64_t)n);
    b->hsize = wh_batch_host_off(b, b->size);
    return true;
}

bool wh_batch_layout(wh_batch_t *b, const wh_sample_meta_t *m, uint32_t n, uint32_t want,
                     wh_err_t *err) {
    uint64_t nbytes[WH_MAX_FIELDS];
    for (int f = 0; f < m->nfields; f++) {
        b->meta[f] = m->f[f];
        nbytes[f] = m->f[f].nbytes;
    }
    return wh__layout(b, m->nfields, nbytes, n, want, err);
}

size_t wh_batch_checks(const wh_batch_t *b) {
    size_t n = 0;
    for (int f = 0; f < b->nfields; f++) n += (b->want & ~b->direct) >> f & 1u;
    return n * b->n + 1;
}

uint64_t wh_batch_host_off(const wh_batch_t *b, uint64_t off) {
    uint64_t skip = 0;
    for (int f = 0; f < b->nfields; f++)
        if ((b->direct & (1u << f)) && b->off[f] < off)
            skip += WH_ALIGN_UP(b->meta[f].nbytes * b->n);
    return off - skip;
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
    if (c->i == 0) { /* again on a retry of the first row: the sample read may differ */
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
        if ((want & (1u << f)) && !(b->direct & (1u << f)))
            dst[f] = c->data + wh_batch_host_off(b, b->off[f]) + (uint64_t)c->i * m->f[f].nbytes;
    return true;
}

/* float to IEEE half, rounding to nearest even */
static uint16_t wh__half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    int32_t exp = (int32_t)((x >> 23) & 0xffu);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    exp = exp - 127 + 15;
    if (exp >= 0x1f) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp), h = mant >> shift, rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* float to bfloat16, rounding to nearest even */
static uint16_t wh__bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* count elements of dtype at p set to the value; false for a dtype that
 * cannot hold it (bool, complex) */
static bool wh__fill_value(char *p, int dtype, uint64_t count, int64_t vi, double vf) {
    unsigned char one[8];
    size_t size = wh_dtype_size(dtype);
    switch (dtype) {
    case WH_DT_U8: one[0] = (uint8_t)vi; break;
    case WH_DT_I8: one[0] = (uint8_t)(int8_t)vi; break;
    case WH_DT_U16: {
        uint16_t v = (uint16_t)vi;
        memcpy(one, &v, 2);
    } break;
    case WH_DT_I16: {
        int16_t v = (int16_t)vi;
        memcpy(one, &v, 2);
    } break;
    case WH_DT_U32: {
        uint32_t v = (uint32_t)vi;
        memcpy(one, &v, 4);
    } break;
    case WH_DT_I32: {
        int32_t v = (int32_t)vi;
        memcpy(one, &v, 4);
    } break;
    case WH_DT_U64: {
        uint64_t v = (uint64_t)vi;
        memcpy(one, &v, 8);
    } break;
    case WH_DT_I64: memcpy(one, &vi, 8); break;
    case WH_DT_F16: {
        uint16_t v = wh__half((float)vf);
        memcpy(one, &v, 2);
    } break;
    case WH_DT_BF16: {
        uint16_t v = wh__bf16((float)vf);
        memcpy(one, &v, 2);
    } break;
    case WH_DT_F32: {
        float v = (float)vf;
        memcpy(one, &v, 4);
    } break;
    case WH_DT_F64: memcpy(one, &vf, 8); break;
    default: return false;
    }
    for (uint64_t k = 0; k < count; k++) memcpy(p + k * size, one, size);
    return true;
}

/* pad='ignore': the padding rows' label fields hold the ignore value. */
static void wh__fill_ignore(const wh_batch_fill_t *rq, const wh_batch_t *b, char *base) {
    uint32_t fields = rq->ignore_fields & rq->want;
    uint64_t pad_off = wh_batch_host_off(b, b->pad_off);
    for (uint32_t i = 0; fields && i < b->n; i++) {
        if (!base[pad_off + i]) continue;
        for (int f = 0; f < WH_MAX_FIELDS; f++) {
            if (!(fields & (1u << f))) continue;
            const wh_field_meta_t *m = &b->meta[f];
            size_t size = wh_dtype_size(m->dtype);
            char *p =
                base + wh_batch_host_off(b, b->off[f]) + (uint64_t)i * m->nbytes; /* never direct */
            if (!size ||
                !wh__fill_value(p, m->dtype, m->nbytes / size, rq->ignore_int, rq->ignore_float))
                continue;
            if (rq->sums) rq->sums[(uint64_t)i * WH_MAX_FIELDS + f] = XXH3_64bits(p, m->nbytes);
        }
    }
}

/* A row of the registered path: a view of the sample (held in
 * rq->views[i] for the device copy), large fields left in the store and
 * small ones gathered into the memory. */
static bool wh__view_row(const wh_batch_fill_t *rq, wh__bfill_t *c, wh_read_at_t *at,
                         wh_sample_meta_t *meta, wh_err_t *err) {
    uint32_t i = c->i;
    wh_buf_t *v = NULL;
    if (!wh_store_view_sample(rq->st, at, rq->timeout_s, rq->stop, &v, meta, err)) return false;
    rq->views[i] = v;
    wh_batch_t *b = c->b;
    if (i == 0) { /* before the layout: the memory leaves these fields out */
        b->direct = 0;
        for (int f = 0; f < meta->nfields; f++)
            if ((rq->want & (1u << f)) && !(rq->ignore_fields & (1u << f)) &&
                meta->f[f].nbytes >= rq->direct_min)
                b->direct |= 1u << f;
    }
    void *dst[WH_MAX_FIELDS] = {0};
    if (!wh__bdest(c, meta, dst, err)) return false;
    bool copied = false;
    for (int f = 0; f < meta->nfields; f++) {
        if (!(rq->want & (1u << f))) continue;
        const char *from = (const char *)v->data + meta->f[f].offset;
        if (b->direct & (1u << f)) {
            rq->src[(uint64_t)i * WH_MAX_FIELDS + f] = from;
        } else {
            if (!copied) wh_fault_cut("view-copy", v->data);
            memcpy(dst[f], from, meta->f[f].nbytes);
            c->stats->host_bytes += meta->f[f].nbytes;
            copied = true;
        }
    }
    /* the view was checked before the copy; a cut since read zero pages */
    return !copied || wh_store_view_intact(v, err);
}

bool wh_batch_fill(const wh_batch_fill_t *rq, uint64_t gen, wh_batch_t *b, void **data,
                   wh_batch_stats_t *stats, wh_err_t *err) {
    memset(stats, 0, sizeof *stats);
    stats->gen = gen;
    *data = NULL;
    if (rq->n < 1) return wh_err_set(err, WH_E_INVALID, "a batch needs at least one row");
    wh_read_at_t at;
    wh__bfill_t c = {rq, b, stats, NULL, 0, &at};
    b->direct = 0;
    b->src = rq->views ? rq->src : NULL;
    b->views = rq->views;
    for (uint32_t i = 0; i < rq->n; i++) {
        bool pad;
        memset(&at, 0, sizeof at);
        at.gen = gen;
        at.strict = rq->strict;
        at.exact = rq->exact;
        at.spec_gen = rq->spec_gen;
        rq->at(rq->at_ctx, i, &at.pos, &pad);
        c.i = i;
        wh_sample_meta_t meta;
        bool ok = rq->views ? wh__view_row(rq, &c, &at, &meta, err)
                            : wh_store_read_sample(rq->st, &at, rq->timeout_s, rq->stop, wh__bdest,
                                                   &c, &meta, err);
        if (ok && !rq->views)
            for (int f = 0; f < meta.nfields; f++)
                if (rq->want & (1u << f)) stats->host_bytes += meta.f[f].nbytes;
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
        base[wh_batch_host_off(b, b->pad_off) + i] = pad || at.pad;
        int64_t g64 = (int64_t)gen, p64 = at.pos, v64 = (int64_t)meta.params_version;
        memcpy(base + wh_batch_host_off(b, b->gen_off) + 8 * (uint64_t)i, &g64, 8);
        memcpy(base + wh_batch_host_off(b, b->pos_off) + 8 * (uint64_t)i, &p64, 8);
        memcpy(base + wh_batch_host_off(b, b->pv_off) + 8 * (uint64_t)i, &v64, 8);
        if (rq->sums)
            for (int f = 0; f < meta.nfields; f++)
                rq->sums[(uint64_t)i * WH_MAX_FIELDS + f] = meta.f[f].checksum;
    }
    wh__fill_ignore(rq, b, c.data);
    stats->gen = gen;
    *data = c.data;
    return true;
}

int wh_batch_parts(const wh_batch_t *b, const char *h, uint64_t size, wh_batch_put_fn put,
                   void *ctx) {
    uint64_t at = 0, hat = 0; /* the next run's offset in the batch and in host */
    int rc = 0;
    for (int f = 0; f < WH_MAX_FIELDS && !rc; f++) {
        if (!(b->direct & (1u << f))) continue;
        uint64_t nb = b->meta[f].nbytes;
        if (b->off[f] > at) {
            rc = put(ctx, at, h + hat, b->off[f] - at, false);
            hat += b->off[f] - at;
        }
        for (uint32_t i = 0; i < b->n && !rc; i++)
            rc = put(ctx, b->off[f] + i * nb, b->src[(uint64_t)i * WH_MAX_FIELDS + f], nb, true);
        at = b->off[f] + WH_ALIGN_UP(b->n * nb);
    }
    if (!rc && size > at) rc = put(ctx, at, h + hat, size - at, false);
    return rc;
}

typedef struct {
    char *to;
    uint64_t rows;
} wh__gather_t;

static int wh__gather_put(void *ctx, uint64_t at, const char *src, uint64_t len, bool row) {
    wh__gather_t *g = ctx;
    memcpy(g->to + at, src, len);
    if (row) g->rows += len;
    return 0;
}

bool wh_batch_gather(const wh_batch_t *b, const char *h, char *to, uint64_t *rows, wh_err_t *err) {
    wh__gather_t g = {to, 0};
    wh_batch_parts(b, h, b->size, wh__gather_put, &g);
    *rows = g.rows;
    for (uint32_t i = 0; b->direct && b->views && i < b->n; i++)
        if (!wh_store_view_intact(b->views[i], err)) return false;
    return true;
}

/* ---- the wire form (wh_batch.h) ---- */

/* Words of the head, then off[nfields] and row[nfields]; with direct
 * fields the read settings, then the sums. */
enum {
    WH__W_MAGIC,
    WH__W_N,
    WH__W_NFIELDS,
    WH__W_WANT,
    WH__W_DIRECT,
    WH__W_SIZE,
    WH__W_HSIZE,
    WH__W_PAD,
    WH__W_GEN,
    WH__W_POS,
    WH__W_PV,
    WH__W_HEAD
};
enum {
    WH__W_TIMEOUT,
    WH__W_STRICT,
    WH__W_IGNORE_FIELDS,
    WH__W_IGNORE_INT,
    WH__W_IGNORE_FLOAT,
    WH__W_READ
};

static uint64_t wh__wire_words(uint64_t nfields, uint64_t n, bool direct) {
    return WH__W_HEAD + 2 * nfields + (direct ? WH__W_READ + n * nfields : 0);
}

size_t wh_batch_wire_size(const wh_batch_t *b) {
    return (size_t)wh__wire_words((uint64_t)b->nfields, b->n, b->direct != 0) * 8;
}

static uint64_t wh__bits(double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
}

void wh_batch_wire_write(const wh_batch_t *b, const wh_batch_fill_t *rq, const uint64_t *sums,
                         void *out) {
    uint64_t *w = out, nf = (uint64_t)b->nfields;
    w[WH__W_MAGIC] = WH_BATCH_WIRE_MAGIC;
    w[WH__W_N] = b->n;
    w[WH__W_NFIELDS] = nf;
    w[WH__W_WANT] = b->want;
    w[WH__W_DIRECT] = b->direct;
    w[WH__W_SIZE] = b->size;
    w[WH__W_HSIZE] = b->hsize;
    w[WH__W_PAD] = b->pad_off;
    w[WH__W_GEN] = b->gen_off;
    w[WH__W_POS] = b->pos_off;
    w[WH__W_PV] = b->pv_off;
    for (int f = 0; f < b->nfields; f++) {
        w[WH__W_HEAD + f] = b->off[f];
        w[WH__W_HEAD + nf + f] = b->meta[f].nbytes;
    }
    if (!b->direct) return;
    uint64_t *r = w + WH__W_HEAD + 2 * nf;
    r[WH__W_TIMEOUT] = wh__bits(rq->timeout_s);
    r[WH__W_STRICT] = rq->strict;
    r[WH__W_IGNORE_FIELDS] = rq->ignore_fields;
    r[WH__W_IGNORE_INT] = (uint64_t)rq->ignore_int;
    r[WH__W_IGNORE_FLOAT] = wh__bits(rq->ignore_float);
    for (uint32_t i = 0; i < b->n; i++)
        memcpy(r + WH__W_READ + i * nf, sums + (size_t)i * WH_MAX_FIELDS, nf * 8);
}

/* Why the wire form at p is not a layout wh__layout gives, or NULL. */
static const char *wh__wire_why(const unsigned char *p, size_t len, wh_batch_wire_t *w) {
    uint64_t h[WH__W_HEAD];
    if (len < sizeof h) return "too short";
    memcpy(h, p, sizeof h);
    uint64_t n = h[WH__W_N], nf = h[WH__W_NFIELDS], want = h[WH__W_WANT], direct = h[WH__W_DIRECT];
    if (h[WH__W_MAGIC] != WH_BATCH_WIRE_MAGIC) return "not a batch layout";
    if (nf < 1 || nf > WH_MAX_FIELDS || n < 1 || n > UINT32_MAX)
        return "rows or fields out of range";
    if (!want || want >> nf || (direct & ~want)) return "fields batched out of range";
    if (len != wh__wire_words(nf, n, direct != 0) * 8) return "its length is not its rows'";
    uint64_t off[WH_MAX_FIELDS], row[WH_MAX_FIELDS];
    memcpy(off, p + WH__W_HEAD * 8, nf * 8);
    memcpy(row, p + (WH__W_HEAD + nf) * 8, nf * 8);
    wh_batch_t *b = &w->b;
    b->direct = (uint32_t)direct;
    for (uint64_t f = 0; f < nf; f++) b->meta[f].nbytes = row[f]; /* before: hsize counts them */
    if (!wh__layout(b, (int)nf, row, (uint32_t)n, (uint32_t)want, NULL))
        return "its rows' sizes overflow";
    if (memcmp(b->off, off, nf * 8) || b->pad_off != h[WH__W_PAD] || b->gen_off != h[WH__W_GEN] ||
        b->pos_off != h[WH__W_POS] || b->pv_off != h[WH__W_PV] || b->size != h[WH__W_SIZE] ||
        b->hsize != h[WH__W_HSIZE])
        return "its offsets or sizes are not the ones its rows give";
    w->checks = wh_batch_checks(b);
    if (!direct) return NULL;
    uint64_t r[WH__W_READ];
    memcpy(r, p + (WH__W_HEAD + 2 * nf) * 8, sizeof r);
    memcpy(&w->timeout_s, &r[WH__W_TIMEOUT], 8);
    memcpy(&w->ignore_float, &r[WH__W_IGNORE_FLOAT], 8);
    w->strict = r[WH__W_STRICT] != 0;
    w->ignore_int = (int64_t)r[WH__W_IGNORE_INT];
    if (r[WH__W_STRICT] > 1 || r[WH__W_IGNORE_FIELDS] & ~(want & ~direct) ||
        !(w->timeout_s >= 0 && w->timeout_s <= 1e9))
        return "its read settings are out of range";
    w->ignore_fields = (uint32_t)r[WH__W_IGNORE_FIELDS];
    w->sums = p + (WH__W_HEAD + 2 * nf + WH__W_READ) * 8;
    return NULL;
}

bool wh_batch_wire_read(const void *p, size_t len, uint64_t hsize, wh_batch_wire_t *w,
                        wh_err_t *err) {
    memset(w, 0, sizeof *w);
    const char *why = wh__wire_why(p, len, w);
    if (!why && hsize && w->b.hsize != hsize) why = "its part in the slot is not the slot's size";
    if (!why) return true;
    if (!hsize) return wh_err_set(err, WH_E_INVALID, "a ring batch's layout is refused: %s", why);
    return wh_err_set(err, WH_E_INVALID,
                      "a ring batch's layout (%llu bytes, %llu in the slot) does not fit its "
                      "%llu-byte slot: %s",
                      (unsigned long long)w->b.size, (unsigned long long)w->b.hsize,
                      (unsigned long long)hsize, why);
}

bool wh_batch_same_layout(const wh_batch_t *want, const wh_batch_t *got, const wh_schema_t *schema,
                          uint64_t gen, wh_err_t *err) {
    for (int k = 0; k < want->nfields; k++) {
        if (!(want->want & (1u << k)) ||
            (got->off[k] == want->off[k] && got->meta[k].nbytes == want->meta[k].nbytes))
            continue;
        return wh_err_set(err, WH_E_INVALID,
                          "field '%s': generation %llu holds samples of %llu bytes where the "
                          "batch's worker read %llu; samples stacked in one batch need one shape",
                          schema->names[k], (unsigned long long)gen,
                          (unsigned long long)got->meta[k].nbytes,
                          (unsigned long long)want->meta[k].nbytes);
    }
    if (got->size != want->size)
        return wh_err_set(err, WH_E_INVALID, "the batch read again has %llu bytes, not %llu",
                          (unsigned long long)got->size, (unsigned long long)want->size);
    return true;
}
