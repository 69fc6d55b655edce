/* The GPU stage: what its files share (wh_cuda.c the stage, its pools,
 * copies, events and exports; wh_cuda_reg.c store mappings and ring slot
 * files registered in place; wh_cuda_rows.c the hand-over of positions;
 * wh_cuda_feed.c a loader's batches on a device). Calls run feed -> stage,
 * rows -> stage and registrations, stage -> registrations. Internal:
 * included only by those files. */
#ifndef WH_CUDA_INT_H
#define WH_CUDA_INT_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wh_cuda.h"
#include "wh_ring.h"

enum {
    WH__MAX_MAPS = 4 /* mappings one batch's rows may come from */
};

struct wh__dbuf;
struct wh__hbuf;
struct wh__inflight;

struct wh_gpu {
    uint64_t refs; /* 1 for the owner, 1 per busy buffer */
    int device;
    pthread_mutex_t mu;
    wh_cstream_t stream;
    struct wh__dbuf *dbufs;
    struct wh__hbuf *hbufs;
    struct wh__inflight *inflight; /* FIFO in issue order (one stream: completes in order) */
    size_t ninflight, capinflight;
    wh_gpu_stats_t stats;
    void *maps[WH__MAX_MAPS]; /* registrations this stage uses */
    int nmaps;
    bool refused; /* a registration was refused: every batch goes staged */
    /* ring slot mappings this stage registered (wh_gpu_copy_slot) */
    wh_buf_t **slots;
    size_t nslots, capslots;
    bool slots_refused; /* a slot's registration was refused: slots go staged */
};

/* ---- the stage (wh_cuda.c) ---- */

/* Queues the copy of host[0, size) (b NULL) or of a batch whose b->direct
 * fields are rows of registered mappings (b->src) and the rest host's (its
 * b->hsize bytes) to a device buffer of the pool; the stage holds host
 * until the copy's event. */
wh_buf_t *wh__gpu_copy(wh_gpu_t *g, wh_buf_t *host, size_t size, const wh_batch_t *b,
                       wh_err_t *err);
/* Counts bytes of sample rows this stage copied on the host. */
void wh__gpu_host_copied(wh_gpu_t *g, uint64_t bytes);
/* A batch whose b->direct rows could not go from registered memory: its
 * host part (host) and those rows gathered into page-locked memory of the
 * pool, each row's mapping checked after the copy, and held (the ring slot
 * host lies in, or NULL) too; then one copy. */
wh_buf_t *wh__gpu_gather(wh_gpu_t *g, const wh_batch_t *b, const char *host, wh_buf_t *held,
                         wh_err_t *err);

/* ---- registrations (wh_cuda_reg.c) ---- */

/* The registrations b's rows need (their store views' mappings), taken
 * before its copies are queued; false with a WH_E_CUDA error where one is
 * refused. */
bool wh__gpu_maps_for(wh_gpu_t *g, const wh_batch_t *b, wh_err_t *err);
/* Stops using the registrations in maps[0, n) once the stage's queued
 * copies completed. */
void wh__gpu_maps_drop(wh_gpu_t *g, void **maps, int n);
/* One user fewer of map's registration; the last unregisters. */
void wh__gpu_reg_drop(void *map);
/* Lets go of slot mappings only this stage's registration holds (mutex
 * held). */
void wh__gpu_slots_sweep(wh_gpu_t *g);
/* Whether the slot mapping m is registered for this stage, registering it
 * on first use; takes over the reference m (mutex held). */
bool wh__gpu_slot_registered(wh_gpu_t *g, wh_buf_t *m, wh_err_t *err);
/* Store mappings registered so far by this process. */
uint64_t wh__gpu_registrations(void);

#endif
