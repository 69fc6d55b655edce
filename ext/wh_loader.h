/* Prefetching batch reader: C threads read this rank's share of each epoch
 * straight into stacked batch buffers from a ring; a buffer returns to the
 * ring only when every tensor that exported it is gone. */
#ifndef WH_LOADER_H
#define WH_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wh.h"
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
} wh_loader_config_t;

/* One delivered batch. buf holds one reference for the caller, who must
 * wh_buf_unref it (exported arrays take their own references). */
typedef struct {
    wh_buf_t *buf;
    uint64_t index;                      /* batch index within the epoch */
    uint32_t n;                          /* items in this batch */
    wh_field_meta_t meta[WH_MAX_FIELDS]; /* per-item shape and dtype; nbytes per item */
    uint64_t off[WH_MAX_FIELDS];         /* byte offset of each field's [n, ...] block */
    uint64_t pad_off, gen_off, pos_off;  /* uint8[n], int64[n], int64[n] */
    uint64_t pv_off;                     /* int64[n]: each sample's params version */
} wh_batch_t;

typedef struct {
    uint64_t batches; /* delivered */
    uint64_t items;   /* samples read */
    uint64_t corrupt; /* samples skipped as corrupt (replaced by padding) */
    uint64_t gone;    /* reads retried on a newer generation */
    uint64_t wait_ns; /* time the consumer waited for a batch */
    uint32_t ring;    /* ring buffers allocated */
    char last_skip[WH_ERR_LEN];
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
/* Next batch in order: true with *out filled, or true with *done at the end
 * of the epoch, or true with neither after wait_ms (call again), or false
 * on an error (the epoch cannot go on). */
bool wh_loader_next(wh_loader_t *ld, unsigned wait_ms, wh_batch_t *out, bool *done, wh_err_t *err);
/* The generation the epoch started on. */
uint64_t wh_loader_generation(const wh_loader_t *ld);
void wh_loader_stats(wh_loader_t *ld, wh_loader_stats_t *out);
/* Stops the threads and drops the loader's reference; buffers still held by
 * exported tensors stay valid until released. NULL is a no-op. */
void wh_loader_destroy(wh_loader_t *ld);

/* The DataLoader workers' batch ring (wirehead_torch/_ring.py) assembles
 * batches across processes: a worker and the DataLoader's main process map
 * the same files under /dev/shm, and slot ownership lives in 64-bit control
 * words that both sides change with atomic operations. Every ring file is
 * made and opened through wh_shmfile (ours, mode 0600, never a symlink) and
 * its size is checked again before the mapping is used. */
#define WH_MAP_PATH 256

typedef struct {
    void *base;
    size_t size;
    int fd; /* kept open: the size is re-checked before use (and holds a region's lock) */
    char path[WH_MAP_PATH]; /* for messages */
} wh_map_t;

/* How wh_map_file comes by the file. */
enum {
    WH_MAP_OPEN,   /* an existing file, checked: the DataLoader's main process */
    WH_MAP_CREATE, /* a new file, size bytes reserved: a worker's new slot */
    WH_MAP_REGION  /* a worker's control file: made, or an earlier worker's taken over */
};

/* Maps size bytes of the ring file at path, shared and writable; m owns the
 * mapping and the descriptor (wh_map_close). WH_MAP_REGION also takes the
 * file's lock (flock, exclusive, not waiting; released by wh_map_close or
 * wh_map_unlock): when another live process holds it, false with *busy set
 * (busy may be NULL otherwise). An existing file must be ours with mode
 * 0600 and hold size bytes (a region file with 0 bytes, whose maker has not
 * reserved it yet, is reserved here under the lock); anything else is
 * refused, never written. populate: fault every page in now (a slot mapped
 * once per process is then reused without faults). hugepage: advise
 * transparent huge pages. */
bool wh_map_file(wh_map_t *m, const char *path, size_t size, int how, bool populate, bool hugepage,
                 bool *busy, wh_err_t *err);
/* Releases a region's lock (the mapping stays). */
void wh_map_unlock(wh_map_t *m);
/* The file still holds every mapped byte and is still ours: call before the
 * mapping is touched (a file truncated under us is this error naming it,
 * not a SIGBUS). */
bool wh_map_intact(const wh_map_t *m, wh_err_t *err);
/* XXH3-64 of bytes [off, off + n) of the mapping, after wh_map_intact. */
bool wh_map_hash(const wh_map_t *m, size_t off, size_t n, uint64_t *out, wh_err_t *err);
void wh_map_close(wh_map_t *m);

/* Control words: index i must be < size / 8 (callers check). Sequentially
 * consistent, so a slot's fill sequence is seen before its owner changes. */
int64_t wh_word_load(const wh_map_t *m, size_t i);
void wh_word_store(const wh_map_t *m, size_t i, int64_t v);
/* Sets word i to desired if it holds expect; true if it did. */
bool wh_word_cas(const wh_map_t *m, size_t i, int64_t expect, int64_t desired);
/* Adds d to word i; returns the new value. */
int64_t wh_word_add(const wh_map_t *m, size_t i, int64_t d);

#endif
