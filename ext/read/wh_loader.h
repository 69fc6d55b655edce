/* Prefetching batch reader: C threads read this rank's share of each epoch
 * straight into stacked batch buffers from a ring; a buffer returns to the
 * ring only when every tensor that exported it is gone. */
#ifndef WH_LOADER_H
#define WH_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wh.h"
#include "wh_batch.h"
#include "wh_plan.h"
#include "wh_store.h"

typedef struct wh_loader wh_loader_t;

enum {
    WH_REFRESH_EPOCH = 0,
    WH_REFRESH_STEP = 1
};

/* Where batch memory comes from (the CUDA path supplies pinned memory). */
typedef struct {
    void *(*alloc)(void *ctx, size_t size); /* zeroed or not; NULL on failure */
    void (*free)(void *ctx, void *p, size_t size);
    void *ctx;
} wh_allocator_t;

typedef struct {
    wh_store_config_t store; /* strings copied by wh_loader_new */
    wh_plan_t plan;          /* workers/worker 0; plan.batch pads to whole batches */
    uint32_t batch;          /* batch size >= 1 */
    uint32_t threads;        /* reader threads >= 1 */
    uint32_t prefetch;       /* batches read ahead >= 1 */
    bool drop_last;
    uint32_t want;        /* bit i: deliver field i */
    int refresh;          /* WH_REFRESH_* */
    double timeout_s;     /* wait for the first generation */
    wh_allocator_t alloc; /* zero: aligned heap memory */
    /* > 0: the registered path. Rows are store views held by the batch
     * (wh_batch_t.src/views) until its buffer is released; fields of rows
     * at least this many bytes stay in the store for a device copy, smaller
     * ones are gathered into the batch buffer. 0: every row copied. */
    uint64_t direct_min;
} wh_loader_config_t;

/* A delivered batch (wh_batch_t) holds one reference to its buf for the
 * caller, who must wh_buf_unref it (exported arrays take their own). */

typedef struct {
    uint64_t batches; /* delivered */
    uint64_t items;   /* samples read */
    uint64_t corrupt; /* samples skipped as corrupt (replaced by padding) */
    uint64_t gone;    /* reads retried on a newer generation */
    uint64_t wait_ns; /* time the consumer waited for a batch */
    uint32_t ring;    /* ring buffers allocated */
    /* bytes those buffers hold (page-locked for a device): on the
     * registered path, without the fields left in the store */
    uint64_t ring_bytes;
    char last_skip[WH_ERR_LEN];
    /* sample bytes copied on the host */
    uint64_t host_bytes;
    /* batches are still filled for the registered path */
    bool direct;
} wh_loader_stats_t;

/* New loader; starts its threads. Owned by the caller: wh_loader_destroy.
 * Open it in the process that reads (threads never cross a fork). */
wh_loader_t *wh_loader_new(const wh_loader_config_t *cfg, wh_err_t *err);
/* Batches per epoch. */
uint64_t wh_loader_batches(const wh_loader_t *ld);
/* Items per epoch for this rank (padding included). */
uint64_t wh_loader_items(const wh_loader_t *ld);
/* Starts epoch `epoch` at batch start_batch, reading generation gen (0: the
 * newest; a reclaimed one is replaced by the newest). Waits up to
 * cfg.timeout_s for the first generation. Abandons any previous epoch. */
bool wh_loader_start(wh_loader_t *ld, uint64_t epoch, uint64_t start_batch, uint64_t gen,
                     wh_err_t *err);
/* Spec mode (docs/reproducible.md): the next wh_loader_start's generation
 * holds spec generation spec_gen, read exactly (a lost one is waited for
 * where it is made again, never replaced by the newest). */
void wh_loader_set_spec(wh_loader_t *ld, uint64_t spec_gen);
/* Next batch in order: true with *out filled, or true with *done at the end
 * of the epoch, or true with neither after wait_ms (call again), or false
 * on an error (the epoch cannot go on). */
bool wh_loader_next(wh_loader_t *ld, unsigned wait_ms, wh_batch_t *out, bool *done, wh_err_t *err);
/* The generation the epoch started on. */
uint64_t wh_loader_generation(const wh_loader_t *ld);
void wh_loader_stats(wh_loader_t *ld, wh_loader_stats_t *out);
/* Fills later batches by copying (the registered path was refused). */
void wh_loader_stage_all(wh_loader_t *ld);
/* Stops the threads and drops the loader's reference; buffers still held by
 * exported tensors stay valid until released. NULL is a no-op. */
void wh_loader_destroy(wh_loader_t *ld);

#endif
