/* One batch laid out and filled in one place, for both batch rings: the C
 * loader's heap slots (wh_loader.c) and the DataLoader workers' shared slot
 * files (wh_ring.c). A batch stacks each wanted field [n, ...], each block
 * 64-byte aligned, then is_pad uint8[n], generation int64[n], position
 * int64[n] and params_version int64[n]. */
#ifndef WH_BATCH_H
#define WH_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "wh.h"
#include "wh_store.h"

/* One laid-out batch. buf, where set, holds one reference for its holder. */
typedef struct {
    wh_buf_t *buf;
    uint64_t index;                      /* batch index within the epoch */
    uint32_t n;                          /* items in this batch */
    wh_field_meta_t meta[WH_MAX_FIELDS]; /* per-item shape and dtype; nbytes per item */
    uint64_t off[WH_MAX_FIELDS];         /* byte offset of each field's [n, ...] block */
    uint64_t pad_off, gen_off, pos_off;  /* uint8[n], int64[n], int64[n] */
    uint64_t pv_off;                     /* int64[n]: each sample's params version */
    uint64_t size;                       /* bytes the batch fills */
    uint64_t hsize; /* bytes of buf it fills: size less the direct fields' blocks */
    int nfields;    /* fields of the samples (meta[0..nfields)) */
    uint32_t want;  /* the fields batched, bit f for field f */
    /* the registered path (wh_batch_fill_t.views): with bit f of direct
     * set, row i's field f is not in buf but at src[i * WH_MAX_FIELDS + f],
     * inside the store view views[i], which buf's holder keeps */
    uint32_t direct;
    const char *const *src;
    wh_buf_t *const *views;
} wh_batch_t;

/* Lays out b for n rows of samples like m (the wanted fields only), the
 * fields b->direct names left out of buf: the one place a batch's offsets
 * and sizes are computed (wh_batch_wire_read computes them again here). */
bool wh_batch_layout(wh_batch_t *b, const wh_sample_meta_t *m, uint32_t n, uint32_t want,
                     wh_err_t *err);

/* The rows a ring slot's seal holds for b: each row of each field batched
 * in buf (not those left in the store), and one for the extras. */
size_t wh_batch_checks(const wh_batch_t *b);

/* Where offset off of the laid-out batch is in buf: buf leaves out the
 * direct fields' blocks (they stay in the store), so its page-locked
 * memory is only what the host writes. */
uint64_t wh_batch_host_off(const wh_batch_t *b, uint64_t off);

/* What one fill reads and where its memory comes from. */
typedef struct {
    wh_store_t *st;
    const wh_schema_t *schema; /* field names, for messages (NULL: numbers) */
    uint32_t n;                /* rows >= 1 */
    uint32_t want;             /* bit i: field i */
    double timeout_s;
    const bool *stop; /* may be NULL */
    bool strict;      /* a corrupt sample is an error naming it, not skipped */
    /* spec mode: the generation read holds spec generation spec_gen, read
     * exactly (wh_read_at_t.exact): never replaced by the newest */
    bool exact;
    uint64_t spec_gen;
    /* row i's position and whether the plan pads it */
    void (*at)(void *ctx, uint32_t i, uint32_t *pos, bool *pad);
    void *at_ctx;
    /* memory for the batch, once its layout is known (from the first
     * sample; called again when the first row's read is retried, the new
     * memory replacing the old): at least b->hsize bytes, or NULL with
     * err set */
    void *(*mem)(void *ctx, const wh_batch_t *b, wh_err_t *err);
    void *mem_ctx;
    /* may be NULL: called before each row is copied into the memory (a
     * shared file's size checked again, so a copy cannot fault) */
    bool (*check)(void *ctx, wh_err_t *err);
    /* may be NULL: sums[i * WH_MAX_FIELDS + f] gets the stored XXH3-64 of
     * field f of row i (every field of the sample, wanted or not), the
     * checksum its bytes were checked against */
    uint64_t *sums;
    /* pad='ignore': bit f set, field f of every padding row is filled with
     * the value (integer fields: ignore_int, floating ones: ignore_float),
     * its sum taken anew; the caller checks the value fits the dtype */
    uint32_t ignore_fields;
    int64_t ignore_int;
    double ignore_float;
    /* may be NULL: the registered path. Each row is a store view kept in
     * views[i] (n entries, the caller's to unref; NULL where none was
     * taken); a wanted field whose row is at least direct_min bytes (and
     * not an ignore field) stays in the store, its address in
     * src[i * WH_MAX_FIELDS + f]; smaller rows are copied into the memory */
    wh_buf_t **views;
    const char **src;
    uint64_t direct_min;
} wh_batch_fill_t;

/* What one fill met on the way. */
typedef struct {
    uint64_t gone;    /* reads retried on a newer generation */
    uint64_t corrupt; /* samples skipped as corrupt (a neighbour stands in as padding) */
    char last_skip[WH_ERR_LEN];
    uint64_t gen;        /* the generation the last row was read from */
    uint64_t host_bytes; /* sample bytes copied on the host */
    /* a row whose sample has another layout than the first row's: where */
    bool mismatch;
    uint64_t mismatch_gen;
    uint32_t mismatch_pos;
} wh_batch_stats_t;

/* Reads the n rows, starting at generation gen, each once through the
 * store's read policy straight into its row, and writes the extras. *data
 * gets the memory (from rq->mem), *b the layout. A row whose sample has
 * another layout than the first is an error naming the field. */
bool wh_batch_fill(const wh_batch_fill_t *rq, uint64_t gen, wh_batch_t *b, void **data,
                   wh_batch_stats_t *stats, wh_err_t *err);

/* The parts of a laid-out batch whose direct fields are left in the store
 * (b->direct, b->src): put(ctx, at, src, len, row) for every run of the
 * host part h between them and every direct row, in batch order (at: the
 * offset in the full layout of size bytes); a nonzero return stops the walk
 * and is returned. */
typedef int (*wh_batch_put_fn)(void *ctx, uint64_t at, const char *src, uint64_t len, bool row);
int wh_batch_parts(const wh_batch_t *b, const char *h, uint64_t size, wh_batch_put_fn put,
                   void *ctx);
/* The parts gathered into to (the whole layout, b->size bytes), *rows
 * getting the rows' bytes copied; then every row's view checked, so a row
 * cut under the copy is an error naming its store, not zeros. */
bool wh_batch_gather(const wh_batch_t *b, const char *h, char *to, uint64_t *rows, wh_err_t *err);

/* ---- a batch's layout as it crosses processes ----
 *
 * A DataLoader worker's batch reaches the main process as a handle that
 * Python pickles; what the main process needs of the batch's layout (to
 * claim its slot, to copy it, rows left in the store among them) travels
 * in it as bytes written and read back here, never computed or checked
 * anywhere else: Python carries them opaque. Native uint64 words, in
 * order: WH_BATCH_WIRE_MAGIC, n, nfields, want, direct, size, hsize,
 * pad_off, gen_off, pos_off, pv_off, off[nfields], the bytes of a row of
 * each field [nfields]; with direct fields then how a row is read again as
 * the worker read it (timeout_s as a double, strict, ignore_fields,
 * ignore_int, ignore_float as a double) and every row's stored checksums
 * (n x nfields, each the XXH3-64 its bytes were checked against). */
#define WH_BATCH_WIRE_MAGIC 0x314f59414c424857ull /* "WHBLAYO1" */

/* A layout read back: b's n, nfields, want, direct, meta[f].nbytes,
 * offsets and sizes (no dtypes, shapes, buf or views). */
typedef struct {
    wh_batch_t b;
    size_t checks; /* wh_batch_checks(&b) */
    /* with direct fields (b.direct): the worker's read of the batch */
    double timeout_s;
    bool strict;
    uint32_t ignore_fields;
    int64_t ignore_int;
    double ignore_float;
    const unsigned char *sums; /* n x nfields uint64 inside the bytes read (unaligned) */
} wh_batch_wire_t;

/* Bytes of b's wire form. */
size_t wh_batch_wire_size(const wh_batch_t *b);
/* Writes b's wire form (wh_batch_wire_size(b) bytes) to out; with direct
 * fields rq (the fill, its read settings) and sums (per row WH_MAX_FIELDS
 * stored checksums, wh_batch_fill_t.sums) go with it. */
void wh_batch_wire_write(const wh_batch_t *b, const wh_batch_fill_t *rq, const uint64_t *sums,
                         void *out);
/* Reads a wire form of len bytes at p into w and checks it: its offsets and
 * sizes must be the ones wh_batch_layout gives for its rows, and where
 * hsize is nonzero (the bytes of the memory the batch arrived in) its part
 * in buf must be hsize bytes. Anything else is an error naming the layout;
 * w keeps pointers into p. */
bool wh_batch_wire_read(const void *p, size_t len, uint64_t hsize, wh_batch_wire_t *w,
                        wh_err_t *err);
/* A batch read again (got) has the layout of the one it stands for (want):
 * else an error naming the first field of another size (schema: names;
 * gen: the generation it was read from). */
bool wh_batch_same_layout(const wh_batch_t *want, const wh_batch_t *got, const wh_schema_t *schema,
                          uint64_t gen, wh_err_t *err);

#endif
