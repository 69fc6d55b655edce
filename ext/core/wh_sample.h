/* Sample format: a versioned header, one descriptor per field, then each
 * field's bytes (C-contiguous, 64-byte aligned from the sample start).
 *
 *   header   64 bytes  magic, format version, nfields, schema hash,
 *                      total size, header size, header checksum,
 *                      generation and position the sample was stored at,
 *                      the params version it was made under (bytes 56..63:
 *                      zero in samples of builds before params, read as 0)
 *   desc[n]  96 bytes  dtype, ndim, shape[8], offset, nbytes, XXH3 checksum
 *   data               field 0 at desc[0].offset, ...
 *
 * All integers little-endian. Every size is validated on decode before any
 * byte is copied. */
#ifndef WH_SAMPLE_H
#define WH_SAMPLE_H

#include "wh.h"

#define WH_SAMPLE_MAGIC 0x31534857u /* "WHS1" */
#define WH_SAMPLE_HDR_SIZE 64
#define WH_SAMPLE_DESC_SIZE 96
/* Largest encoded sample (2^48 bytes): far above any real sample, low
 * enough that sizes read from a store cannot wrap when rounded up. */
#define WH_SAMPLE_MAX_BYTES (1ull << 48)

/* The SAMPLE schema: ordered field names and their hash. */
typedef struct {
    int nfields;
    char names[WH_MAX_FIELDS][WH_MAX_NAME];
    uint64_t hash; /* XXH3 of the names, NUL-separated, with format version */
} wh_schema_t;

bool wh_schema_init(wh_schema_t *s, int n, const char *const *names, wh_err_t *err);
typedef struct {
    int dtype;
    int ndim;
    int64_t shape[WH_MAX_NDIM];
    uint64_t offset; /* from the sample start */
    uint64_t nbytes;
    uint64_t checksum; /* XXH3_64bits of the nbytes */
} wh_field_meta_t;

typedef struct {
    int nfields;
    uint64_t gen; /* where the sample was stored (wh_sample_set_place) */
    uint32_t pos;
    uint64_t params_version; /* in (encode) and out (decode): docs/params.md */
    uint64_t total_size;     /* header + descriptors + data, padded */
    uint64_t header_size;    /* header + descriptors, padded to WH_ALIGN */
    wh_field_meta_t f[WH_MAX_FIELDS];
} wh_sample_meta_t;

/* Checks caller arrays against the schema (count, known dtype, ndim,
 * non-negative shape, no size overflow) and lays out the encoded sample in
 * meta (checksums not yet set). Errors name the field. */
bool wh_sample_plan(const wh_schema_t *s, const wh_array_t *arr, int n, wh_sample_meta_t *meta,
                    wh_err_t *err);

/* Encodes arrays laid out by wh_sample_plan into dst (cap bytes, at least
 * meta->total_size), copying any strides into C order and computing the
 * checksums on the way (meta->f[i].checksum is filled); the header records
 * meta->params_version (set it after wh_sample_plan, which zeroes it). With fault_point
 * set, calls wh_fault_put_midway() once half of the data is written. */
bool wh_sample_encode(void *dst, uint64_t cap, const wh_schema_t *s, const wh_array_t *arr,
                      wh_sample_meta_t *meta, bool fault_point, wh_err_t *err);

/* Records in an encoded sample's header the generation and position it is
 * committed at, and re-hashes the header (the data is untouched). */
void wh_sample_set_place(void *buf, const wh_sample_meta_t *meta, uint64_t gen, uint32_t pos);

/* Parses and validates the header and descriptors of an encoded sample held
 * in len readable bytes (len may cover only the header, see below):
 * magic, header checksum, version, schema hash, the place the sample
 * records (it must be generation gen, position pos: an index pointing at
 * another sample reads as corrupt), dtype codes, ndim, that
 * nbytes == prod(shape) * itemsize, that offsets are aligned, ordered and
 * within total_size. If len < total_size only the header part is required
 * to be present (for chunked stores). The checksum is checked first, so
 * damage is WH_E_CORRUPT; WH_E_SCHEMA only for an intact header of
 * another format version or schema. */
bool wh_sample_decode_meta(const void *buf, uint64_t len, const wh_schema_t *s, uint64_t gen,
                           uint32_t pos, wh_sample_meta_t *meta, wh_err_t *err);

/* XXH3 of a field's bytes compared with its descriptor: WH_E_CORRUPT on
 * mismatch, naming the field. */
bool wh_sample_verify(const wh_schema_t *s, const wh_sample_meta_t *meta, int i, const void *data,
                      wh_err_t *err);

/* A field's checksum computed while its bytes are copied in, in order: one
 * pass over the bytes where a copy and then wh_sample_verify would be two.
 * wh_field_hash_copy takes the field's next n bytes; _check compares the
 * digest of all of them with the descriptor (WH_E_CORRUPT naming the field). */
typedef struct wh_field_hash wh_field_hash_t;
wh_field_hash_t *wh_field_hash_new(void); /* NULL: out of memory */
void wh_field_hash_free(wh_field_hash_t *h);
void wh_field_hash_reset(wh_field_hash_t *h);
void wh_field_hash_copy(wh_field_hash_t *h, void *dst, const void *src, uint64_t n);
bool wh_field_hash_check(wh_field_hash_t *h, const wh_schema_t *s, const wh_sample_meta_t *meta,
                         int i, wh_err_t *err);

/* Copies field i of the encoded sample in buf into dst (meta->f[i].nbytes
 * bytes), checking the checksum when verify is set; counts the copy. On a
 * checksum error dst holds garbage and WH_E_CORRUPT is returned. */
bool wh_sample_copy_field(const void *buf, const wh_schema_t *s, const wh_sample_meta_t *meta,
                          int i, void *dst, bool verify, wh_err_t *err);

/* Shapes and dtypes equal (used to check samples stacked in one batch). */
bool wh_field_meta_same(const wh_field_meta_t *a, const wh_field_meta_t *b);

#endif
