/* The GPU stage over the CUDA runtime (wh_cudart.h): page-locked host
 * memory, async host-to-device copies on a side stream, events, and a pool
 * of device buffers that are reused only after their consumers' work is
 * done. */
#ifndef WH_CUDA_H
#define WH_CUDA_H

#include "wh.h"
#include "wh_cudart.h"
#include "wh_loader.h"

/* Stream handles as the array API gives them: 1 the legacy default stream,
 * 2 the per-thread default stream, anything else a cudaStream_t. */
typedef uintptr_t wh_stream_t;

typedef struct wh_gpu wh_gpu_t;

typedef struct {
    uint64_t copies;       /* host-to-device copies issued */
    uint64_t h2d_bytes;    /* bytes they carried */
    uint64_t copy_ns;      /* copy time measured by events (completed copies) */
    uint64_t host_waits;   /* times a host thread had to wait on an event */
    uint64_t host_wait_ns; /* time spent there */
    uint64_t stream_waits; /* cudaStreamWaitEvent calls for consumers */
    uint32_t device_bufs;  /* device buffers in the pool */
    uint32_t pinned_bufs;  /* page-locked host buffers in the pool */
    uint64_t device_bytes; /* device memory held by the pool */
    /* sample bytes this stage copied on the host (a refused registration) */
    uint64_t host_copy_bytes;
    /* store mappings registered so far, this process, all stages */
    uint64_t registrations;
    /* batches of the hand-over of positions read again in this process
     * (a row's generation reclaimed before its copy) */
    uint64_t rereads;
    /* why batches are staged rather than copied from the registered store
     * ("" when they are not) */
    char staged_why[WH_ERR_LEN];
} wh_gpu_stats_t;

/* Rows at least this size are copied from the registered store one
 * cudaMemcpyAsync each; smaller ones are gathered into the page-locked batch
 * buffer and sent with it (measured on an H100: one copy per row gave
 * 50 GB/s for 3.5 MB rows, 11.5 GB/s for 64 KiB and 1.2 GB/s for 4 KiB). */
#define WH_GPU_DIRECT_MIN_ROW (256u * 1024u)

/* A stage for one device: its own non-blocking copy stream. Open it in the
 * process that uses it (CUDA state never crosses fork). */
wh_gpu_t *wh_gpu_new(int device, wh_err_t *err);
/* Drops the owner's reference; device buffers still exported stay valid
 * until released. NULL is a no-op. */
void wh_gpu_destroy(wh_gpu_t *g);
/* A page-locked host buffer of at least size bytes from the stage's pool
 * (refs = 1; it returns to the pool when the last reference goes). */
wh_buf_t *wh_gpu_pinned(wh_gpu_t *g, size_t size, wh_err_t *err);
/* Copies host->data[0, size) to a device buffer from the pool with
 * cudaMemcpyAsync on the copy stream; returns that buffer (refs = 1,
 * device_type 2). The stage keeps a reference to `host` until the copy's
 * event has completed, so a ring slot is reused only after its copy. Before
 * the copy, the copy stream waits on the events recorded when the device
 * buffer's previous consumers released it. */
wh_buf_t *wh_gpu_copy(wh_gpu_t *g, wh_buf_t *host, size_t size, wh_err_t *err);
/* Copies a loader batch to a device buffer: like wh_gpu_copy of b->buf,
 * but the fields b->direct names go straight from the store's mapping
 * (registered once per process and mapping with cudaHostRegister, read-only
 * where the runtime can), one copy per row, and the rest of b->buf as one
 * copy per run. b->buf (which holds the rows' store views) is kept until the
 * copy's event. Where registration is refused, the batch is gathered whole
 * (b->buf's part and the direct rows) into page-locked memory of the
 * stage's pool and goes as one copy; *refused says so (and the stage's
 * staged_why why). */
wh_buf_t *wh_gpu_copy_batch(wh_gpu_t *g, const wh_batch_t *b, bool *refused, wh_err_t *err);
/* Copies a ring slot's batch (held: a buffer from wh_ring_claim or
 * wh_ring_local) to a device buffer in one copy straight from the slot
 * file's mapping, registered once per process and mapping (again when the
 * slot grows to a new file; the old registration goes once no batch over it
 * is left). held is kept until the copy's event, so the slot goes back to
 * its worker only after its copy (*direct says it went so). Where
 * registration is refused (staged_why says why), or held is no slot's (heap
 * memory), the bytes are copied into page-locked memory first
 * (host_copy_bytes); after a refusal every later slot goes that way. */
wh_buf_t *wh_gpu_copy_slot(wh_gpu_t *g, wh_buf_t *held, bool *direct, wh_err_t *err);
/* Copies a ring slot's batch whose large fields a worker left in the store
 * (the hand-over of positions, docs/gpu.md) to a device buffer; w: its
 * layout as the worker wrote it (wh_batch_wire_read, checked against
 * held's size), the slot holding the rest (host layout, wh_batch_host_off)
 * and each row's generation and position; st: this process's handle on
 * the store. The slot's part goes straight from its registered mapping
 * (one copy a run), each large row straight from this process's
 * registered mapping of the store under a view taken here (one copy a row;
 * its bytes are not hashed again when its stored checksum is the one the
 * worker verified). The slot and the views are held until the copy's
 * event. A row whose generation was reclaimed since the worker read it (or
 * whose sample is no longer the one the worker read) makes the whole batch
 * read again here through the read policy into page-locked memory,
 * checked, one copy (*reread; host_copy_bytes counts its rows); a layout
 * other than the worker's is then an error naming the field. A refused
 * registration gathers the batch into page-locked memory (*direct false,
 * staged_why says why). */
wh_buf_t *wh_gpu_copy_slot_rows(wh_gpu_t *g, wh_buf_t *held, wh_store_t *st,
                                const wh_batch_wire_t *w, bool *direct, bool *reread,
                                wh_err_t *err);
/* Records why batches are staged (shown by wh_gpu_stats). */
void wh_gpu_set_staged(wh_gpu_t *g, const char *why);
/* Whether the loaded runtime can register memory in place. */
bool wh_cuda_can_register(void);
/* Drops references to host buffers whose copies completed (no waiting). */
void wh_gpu_poll(wh_gpu_t *g);
void wh_gpu_stats(wh_gpu_t *g, wh_gpu_stats_t *out);

/* For DLPack export of a device buffer made by wh_gpu_copy: makes `stream`
 * wait on the copy's event (stream 0 is refused as ambiguous; -1 means the
 * consumer synchronises itself). */
bool wh_gpu_export(wh_buf_t *b, intptr_t stream, wh_err_t *err);
/* An export made for `stream` was released: records an event there that the
 * next copy into this buffer waits on. */
void wh_gpu_exported_done(wh_buf_t *b, intptr_t stream);

/* A loader's batches on a device: up to `depth` batches copied ahead (their
 * copies overlap the consumer's compute). The loader's ring must be
 * page-locked (wh_cuda_host_alloc). */
typedef struct wh_gpu_feed wh_gpu_feed_t;
wh_gpu_feed_t *wh_gpu_feed_new(wh_gpu_t *g, wh_loader_t *ld, uint32_t depth, wh_err_t *err);
/* As wh_loader_next, but out->buf is a device buffer (same offsets) and
 * *any_pad says whether the batch holds padding (read on the host before
 * the copy, so callers need no device sync to know). */
bool wh_gpu_feed_next(wh_gpu_feed_t *f, unsigned wait_ms, wh_batch_t *out, bool *done,
                      bool *any_pad, wh_err_t *err);
/* Drops batches copied ahead (before the loader starts another epoch). */
void wh_gpu_feed_reset(wh_gpu_feed_t *f);
void wh_gpu_feed_destroy(wh_gpu_feed_t *f);

#endif
