/* Sample encode/decode with bounds checks; see wh_sample.h for the layout. */
#define _GNU_SOURCE
#define XXH_STATIC_LINKING_ONLY
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* XXH3 with the widest SIMD the CPU has, chosen at run time */
#endif

#include "wh_sample.h"
#include "wh_fault.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the sample format is little-endian; big-endian hosts need byte swaps"
#endif

/* Copies and hashes in blocks small enough to stay in cache, so hashing
 * reads the block just written instead of going back to memory. */
#define WH__BLOCK (128u * 1024u)

bool wh_schema_init(wh_schema_t *s, int n, const char *const *names, wh_err_t *err) {
    memset(s, 0, sizeof *s);
    if (n < 1 || n > WH_MAX_FIELDS)
        return wh_err_set(err, WH_E_INVALID, "SAMPLE must name 1..%d fields, got %d", WH_MAX_FIELDS,
                          n);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    uint32_t version = WH_FORMAT_VERSION;
    XXH3_64bits_update(&st, &version, sizeof version);
    for (int i = 0; i < n; i++) {
        size_t len = names[i] ? strlen(names[i]) : 0;
        if (len == 0 || len >= WH_MAX_NAME)
            return wh_err_set(err, WH_E_INVALID, "SAMPLE field %d: name must be 1..%d characters",
                              i, WH_MAX_NAME - 1);
        for (int j = 0; j < i; j++)
            if (strcmp(s->names[j], names[i]) == 0)
                return wh_err_set(err, WH_E_INVALID, "SAMPLE names field '%s' twice", names[i]);
        memcpy(s->names[i], names[i], len + 1);
        XXH3_64bits_update(&st, names[i], len + 1);
    }
    s->nfields = n;
    s->hash = XXH3_64bits_digest(&st);
    return true;
}

bool wh_sample_plan(const wh_schema_t *s, const wh_array_t *arr, int n, wh_sample_meta_t *meta,
                    wh_err_t *err) {
    memset(meta, 0, sizeof *meta);
    if (n != s->nfields)
        return wh_err_set(err, WH_E_INVALID, "sample has %d fields, SAMPLE names %d", n,
                          s->nfields);
    uint64_t off = WH_ALIGN_UP((uint64_t)WH_SAMPLE_HDR_SIZE + (uint64_t)n * WH_SAMPLE_DESC_SIZE);
    meta->nfields = n;
    meta->header_size = off;
    for (int i = 0; i < n; i++) {
        const wh_array_t *a = &arr[i];
        wh_field_meta_t *f = &meta->f[i];
        size_t item = wh_dtype_size(a->dtype);
        if (!item)
            return wh_err_set(err, WH_E_INVALID, "field '%s': unsupported dtype code %d",
                              s->names[i], a->dtype);
        if (a->ndim < 0 || a->ndim > WH_MAX_NDIM)
            return wh_err_set(err, WH_E_INVALID, "field '%s': %d dimensions, at most %d",
                              s->names[i], a->ndim, WH_MAX_NDIM);
        uint64_t nb = item;
        for (int d = 0; d < a->ndim; d++) {
            if (a->shape[d] < 0)
                return wh_err_set(err, WH_E_INVALID, "field '%s': negative shape", s->names[i]);
            if (!wh_mul_ok(nb, (uint64_t)a->shape[d], &nb))
                return wh_err_set(err, WH_E_INVALID, "field '%s': size overflows", s->names[i]);
            f->shape[d] = a->shape[d];
        }
        if (nb > 0 && !a->data)
            return wh_err_set(err, WH_E_INVALID, "field '%s': no data", s->names[i]);
        f->dtype = a->dtype;
        f->ndim = a->ndim;
        f->offset = off;
        f->nbytes = nb;
        if (!wh_add_ok(off, nb, &off) || off > WH_SAMPLE_MAX_BYTES)
            return wh_err_set(err, WH_E_INVALID, "field '%s': sample larger than %llu bytes",
                              s->names[i], (unsigned long long)WH_SAMPLE_MAX_BYTES);
        off = WH_ALIGN_UP(off);
    }
    meta->total_size = off;
    return true;
}

static bool wh__contiguous(const wh_array_t *a) {
    int64_t expect = (int64_t)wh_dtype_size(a->dtype);
    for (int d = a->ndim - 1; d >= 0; d--) {
        if (a->shape[d] != 1 && a->strides[d] != expect) return false;
        expect *= a->shape[d];
    }
    return true;
}

/* Copies src (contiguous) to dst hashing block by block; calls the fault
 * hook when the running total crosses *fault_at (then clears it). */
static void wh__copy_hash(char *dst, const char *src, uint64_t n, XXH3_state_t *h, uint64_t *done,
                          uint64_t *fault_at) {
    while (n) {
        uint64_t k = n < WH__BLOCK ? n : WH__BLOCK;
        memcpy(dst, src, k);
        XXH3_64bits_update(h, dst, k);
        dst += k;
        src += k;
        n -= k;
        *done += k;
        if (*fault_at && *done >= *fault_at) {
            *fault_at = 0;
            wh_fault_put_midway();
        }
    }
}

/* Strided gather into C order: walks the outer index, copying one
 * innermost row at a time (a memcpy when the row itself is contiguous). */
static void wh__gather(char *dst, const wh_array_t *a, uint64_t nbytes) {
    size_t item = wh_dtype_size(a->dtype);
    if (a->ndim == 0) {
        memcpy(dst, a->data, item);
        return;
    }
    if (nbytes == 0) return;
    int last = a->ndim - 1;
    int64_t rowlen = a->shape[last];
    int64_t rstride = a->strides[last];
    int64_t idx[WH_MAX_NDIM] = {0};
    for (;;) {
        const char *p = (const char *)a->data;
        for (int d = 0; d < last; d++) p += idx[d] * a->strides[d];
        if (rstride == (int64_t)item) {
            memcpy(dst, p, (size_t)rowlen * item);
            dst += rowlen * item;
        } else {
            for (int64_t j = 0; j < rowlen; j++, dst += item) memcpy(dst, p + j * rstride, item);
        }
        int d = last - 1;
        while (d >= 0 && ++idx[d] == a->shape[d]) idx[d--] = 0;
        if (d < 0) break;
    }
}

static void wh__put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t wh__get_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Header offsets (little-endian fields). */
enum {
    WH__H_VER = 4,
    WH__H_NF = 6,
    WH__H_SCHEMA = 8,
    WH__H_TOTAL = 16,
    WH__H_HSIZE = 24,
    WH__H_SUM = 32,
    WH__H_GEN = 40,
    WH__H_POS = 48,
    WH__H_PARAMS = 56 /* zero in older samples of this format version: params version 0 */
};

/* XXH3 of the header and descriptors, all but the checksum field itself.
 * Format version 1 left bytes 40..63 out. */
static uint64_t wh__header_hash(const unsigned char *b, uint64_t header_size, unsigned version) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, b, WH__H_SUM);
    uint64_t from = version == 1 ? WH_SAMPLE_HDR_SIZE : WH__H_GEN;
    XXH3_64bits_update(&st, b + from, header_size - from);
    return XXH3_64bits_digest(&st);
}

void wh_sample_set_place(void *buf, const wh_sample_meta_t *meta, uint64_t gen, uint32_t pos) {
    unsigned char *b = buf;
    wh__put_u64(b + WH__H_GEN, gen);
    wh__put_u64(b + WH__H_POS, pos);
    wh__put_u64(b + WH__H_SUM, wh__header_hash(b, meta->header_size, WH_FORMAT_VERSION));
}

bool wh_sample_encode(void *dst, uint64_t cap, const wh_schema_t *s, const wh_array_t *arr,
                      wh_sample_meta_t *meta, bool fault_point, wh_err_t *err) {
    if (cap < meta->total_size)
        return wh_err_set(err, WH_E_INTERNAL, "encode: %llu bytes for a %llu-byte sample",
                          (unsigned long long)cap, (unsigned long long)meta->total_size);
    unsigned char *b = dst;
    uint64_t data_total = meta->total_size - meta->header_size, done = 0;
    uint64_t fault_at = fault_point ? (data_total / 2 ? data_total / 2 : 1) : 0;
    for (int i = 0; i < meta->nfields; i++) {
        const wh_array_t *a = &arr[i];
        wh_field_meta_t *f = &meta->f[i];
        char *out = (char *)b + f->offset;
        if (wh__contiguous(a)) {
            XXH3_state_t h;
            XXH3_64bits_reset(&h);
            wh__copy_hash(out, a->data, f->nbytes, &h, &done, &fault_at);
            f->checksum = XXH3_64bits_digest(&h);
        } else {
            wh__gather(out, a, f->nbytes);
            f->checksum = XXH3_64bits(out, f->nbytes);
            done += f->nbytes;
            if (fault_at && done >= fault_at) {
                fault_at = 0;
                wh_fault_put_midway();
            }
        }
        wh_count_in(f->nbytes);
        /* padding bytes are zeroed so identical samples encode identically */
        uint64_t end = f->offset + f->nbytes;
        memset(b + end, 0, WH_ALIGN_UP(end) - end);
    }
    memset(b, 0, meta->header_size);
    uint32_t magic = WH_SAMPLE_MAGIC;
    uint16_t ver = WH_FORMAT_VERSION, nf = (uint16_t)meta->nfields;
    memcpy(b, &magic, 4);
    memcpy(b + WH__H_VER, &ver, 2);
    memcpy(b + WH__H_NF, &nf, 2);
    wh__put_u64(b + WH__H_SCHEMA, s->hash);
    wh__put_u64(b + WH__H_TOTAL, meta->total_size);
    wh__put_u64(b + WH__H_HSIZE, meta->header_size);
    wh__put_u64(b + WH__H_PARAMS, meta->params_version);
    for (int i = 0; i < meta->nfields; i++) {
        const wh_field_meta_t *f = &meta->f[i];
        unsigned char *d = b + WH_SAMPLE_HDR_SIZE + (size_t)i * WH_SAMPLE_DESC_SIZE;
        d[0] = (unsigned char)f->dtype;
        d[1] = (unsigned char)f->ndim;
        for (int k = 0; k < WH_MAX_NDIM; k++) wh__put_u64(d + 8 + 8 * k, (uint64_t)f->shape[k]);
        wh__put_u64(d + 72, f->offset);
        wh__put_u64(d + 80, f->nbytes);
        wh__put_u64(d + 88, f->checksum);
    }
    /* place 0/0 until the store commits it (wh_sample_set_place) */
    wh__put_u64(b + WH__H_SUM, wh__header_hash(b, meta->header_size, WH_FORMAT_VERSION));
    return true;
}

bool wh_sample_decode_meta(const void *buf, uint64_t len, const wh_schema_t *s, uint64_t gen,
                           uint32_t pos, wh_sample_meta_t *meta, wh_err_t *err) {
    const unsigned char *b = buf;
    memset(meta, 0, sizeof *meta);
    if (len < WH_SAMPLE_HDR_SIZE)
        return wh_err_set(err, WH_E_CORRUPT, "sample header truncated (%llu bytes)",
                          (unsigned long long)len);
    uint32_t magic;
    uint16_t ver, nf;
    memcpy(&magic, b, 4);
    memcpy(&ver, b + WH__H_VER, 2);
    memcpy(&nf, b + WH__H_NF, 2);
    if (magic != WH_SAMPLE_MAGIC)
        return wh_err_set(err, WH_E_CORRUPT, "not a wirehead sample (bad magic)");
    if (nf < 1 || nf > WH_MAX_FIELDS)
        return wh_err_set(err, WH_E_CORRUPT, "sample header claims %u fields", nf);
    uint64_t hsize = WH_ALIGN_UP((uint64_t)WH_SAMPLE_HDR_SIZE + (uint64_t)nf * WH_SAMPLE_DESC_SIZE);
    if (wh__get_u64(b + WH__H_HSIZE) != hsize || len < hsize)
        return wh_err_set(err, WH_E_CORRUPT, "sample header size wrong or truncated");
    /* the checksum before anything it covers: a flipped bit in the version
     * or schema is damage (a skipped sample), not a change of format */
    uint64_t sum = wh__get_u64(b + WH__H_SUM);
    if (sum != wh__header_hash(b, hsize, WH_FORMAT_VERSION) &&
        !(ver == 1 && sum == wh__header_hash(b, hsize, 1)))
        return wh_err_set(err, WH_E_CORRUPT, "sample header checksum mismatch");
    if (ver != WH_FORMAT_VERSION)
        return wh_err_set(err, WH_E_SCHEMA, "sample format version %u, this build reads version %d",
                          ver, WH_FORMAT_VERSION);
    if (nf != s->nfields || wh__get_u64(b + WH__H_SCHEMA) != s->hash)
        return wh_err_set(err, WH_E_SCHEMA,
                          "sample was written with another SAMPLE schema (%u fields)", nf);
    meta->gen = wh__get_u64(b + WH__H_GEN);
    uint64_t p = wh__get_u64(b + WH__H_POS);
    if (meta->gen != gen || p != pos)
        return wh_err_set(err, WH_E_CORRUPT,
                          "the sample found there was stored at generation %llu position %llu",
                          (unsigned long long)meta->gen, (unsigned long long)p);
    meta->pos = (uint32_t)p;
    meta->params_version = wh__get_u64(b + WH__H_PARAMS);
    uint64_t total = wh__get_u64(b + WH__H_TOTAL);
    if (total > WH_SAMPLE_MAX_BYTES) /* also keeps every aligned offset below from wrapping */
        return wh_err_set(err, WH_E_CORRUPT, "sample claims %llu bytes", (unsigned long long)total);
    uint64_t off = hsize;
    meta->nfields = nf;
    meta->header_size = hsize;
    for (int i = 0; i < nf; i++) {
        const unsigned char *d = b + WH_SAMPLE_HDR_SIZE + (size_t)i * WH_SAMPLE_DESC_SIZE;
        wh_field_meta_t *f = &meta->f[i];
        f->dtype = d[0];
        f->ndim = d[1];
        size_t item = wh_dtype_size(f->dtype);
        if (!item)
            return wh_err_set(err, WH_E_CORRUPT, "field '%s': unknown dtype code %d", s->names[i],
                              f->dtype);
        if (f->ndim > WH_MAX_NDIM)
            return wh_err_set(err, WH_E_CORRUPT, "field '%s': ndim %d", s->names[i], f->ndim);
        uint64_t nb = item;
        for (int k = 0; k < WH_MAX_NDIM; k++) {
            uint64_t dim = wh__get_u64(d + 8 + 8 * k);
            if (k >= f->ndim) {
                if (dim) return wh_err_set(err, WH_E_CORRUPT, "field '%s': bad shape", s->names[i]);
                continue;
            }
            if (dim > (uint64_t)INT64_MAX || !wh_mul_ok(nb, dim, &nb))
                return wh_err_set(err, WH_E_CORRUPT, "field '%s': shape overflows", s->names[i]);
            f->shape[k] = (int64_t)dim;
        }
        f->offset = wh__get_u64(d + 72);
        f->nbytes = wh__get_u64(d + 80);
        f->checksum = wh__get_u64(d + 88);
        if (f->nbytes != nb)
            return wh_err_set(err, WH_E_CORRUPT,
                              "field '%s': %llu bytes stored, shape and dtype need %llu",
                              s->names[i], (unsigned long long)f->nbytes, (unsigned long long)nb);
        if (f->offset != off || !wh_add_ok(off, nb, &off) || off > total)
            return wh_err_set(err, WH_E_CORRUPT, "field '%s': offset or size out of bounds",
                              s->names[i]);
        off = WH_ALIGN_UP(off);
    }
    if (off != total)
        return wh_err_set(err, WH_E_CORRUPT, "sample total size %llu, fields need %llu",
                          (unsigned long long)total, (unsigned long long)off);
    meta->total_size = total;
    return true;
}

/* The one check of a field's bytes' XXH3 against its descriptor. */
static bool wh__sum_ok(const wh_schema_t *s, const wh_sample_meta_t *meta, int i, uint64_t sum,
                       wh_err_t *err) {
    if (sum != meta->f[i].checksum)
        return wh_err_set(err, WH_E_CORRUPT, "field '%s': checksum mismatch", s->names[i]);
    return true;
}

bool wh_sample_verify(const wh_schema_t *s, const wh_sample_meta_t *meta, int i, const void *data,
                      wh_err_t *err) {
    return wh__sum_ok(s, meta, i, XXH3_64bits(data, meta->f[i].nbytes), err);
}

struct wh_field_hash {
    XXH3_state_t h;
};

wh_field_hash_t *wh_field_hash_new(void) {
    /* XXH3_state_t wants 64-byte alignment (WH_ALIGN) */
    return aligned_alloc(WH_ALIGN, WH_ALIGN_UP(sizeof(wh_field_hash_t)));
}

void wh_field_hash_free(wh_field_hash_t *h) { free(h); }

void wh_field_hash_reset(wh_field_hash_t *h) { XXH3_64bits_reset(&h->h); }

void wh_field_hash_copy(wh_field_hash_t *h, void *dst, const void *src, uint64_t n) {
    uint64_t done = 0, no_fault = 0;
    wh__copy_hash(dst, src, n, &h->h, &done, &no_fault);
}

bool wh_field_hash_check(wh_field_hash_t *h, const wh_schema_t *s, const wh_sample_meta_t *meta,
                         int i, wh_err_t *err) {
    return wh__sum_ok(s, meta, i, XXH3_64bits_digest(&h->h), err);
}

bool wh_sample_copy_field(const void *buf, const wh_schema_t *s, const wh_sample_meta_t *meta,
                          int i, void *dst, bool verify, wh_err_t *err) {
    const wh_field_meta_t *f = &meta->f[i];
    const char *src = (const char *)buf + f->offset;
    wh_count_out(f->nbytes);
    if (!verify) {
        memcpy(dst, src, f->nbytes);
        return true;
    }
    XXH3_state_t h;
    uint64_t done = 0, no_fault = 0;
    XXH3_64bits_reset(&h);
    wh__copy_hash(dst, src, f->nbytes, &h, &done, &no_fault);
    return wh__sum_ok(s, meta, i, XXH3_64bits_digest(&h), err);
}

bool wh_field_meta_same(const wh_field_meta_t *a, const wh_field_meta_t *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int k = 0; k < a->ndim; k++)
        if (a->shape[k] != b->shape[k]) return false;
    return true;
}
