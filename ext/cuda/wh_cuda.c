/* The GPU stage (see wh_cuda.h) over the runtime loaded by wh_cudart.c:
 * its pools of device and page-locked buffers, the copies on its stream
 * and their events, the copies of a loader batch and of a ring slot, and
 * the exports' stream order. */
#define _GNU_SOURCE
#include "wh_cuda_int.h"

#include <unistd.h>

#include "wh_fault.h"

enum {
    WH__MAX_CONSUMERS = 8
};

/* What the pools' buffers share: a buffer whose last reference returns it
 * to its stage's pool. */
typedef struct {
    wh_buf_t buf; /* first member: the release callback casts back */
    struct wh_gpu *g;
    size_t cap;
    bool busy;
} wh__gbuf_t;

typedef struct wh__dbuf {
    wh__gbuf_t p;                  /* first member */
    wh_cevent_t start_ev, copy_ev; /* around the copy into this buffer */
    int ncons;                     /* consumers' release events, one per stream */
    intptr_t cons_stream[WH__MAX_CONSUMERS];
    wh_cevent_t cons_ev[WH__MAX_CONSUMERS];
    struct wh__dbuf *next;
} wh__dbuf_t;

typedef struct wh__hbuf {
    wh__gbuf_t p; /* first member */
    struct wh__hbuf *next;
} wh__hbuf_t;

typedef struct wh__inflight {
    wh_buf_t *host;
    wh__dbuf_t *dev;
    size_t size;
} wh__inflight_t;

static void wh__gpu_free(wh_gpu_t *g) {
    int prev = wh_cudart_enter(g->device);
    if (g->stream) {
        wh_cudart.StreamSynchronize(g->stream);
        wh_cudart.StreamDestroy(g->stream);
    }
    for (wh__dbuf_t *d = g->dbufs, *n; d; d = n) {
        n = d->next;
        /* a consumer's last work may still be queued */
        for (int i = 0; i < d->ncons; i++) {
            wh_cudart.EventSynchronize(d->cons_ev[i]);
            wh_cudart.EventDestroy(d->cons_ev[i]);
        }
        if (d->start_ev) wh_cudart.EventDestroy(d->start_ev);
        if (d->copy_ev) wh_cudart.EventDestroy(d->copy_ev);
        if (d->p.buf.data) wh_cudart.Free(d->p.buf.data);
        free(d);
    }
    for (wh__hbuf_t *h = g->hbufs, *n; h; h = n) {
        n = h->next;
        wh_cudart.FreeHost(h->p.buf.data);
        free(h);
    }
    wh_cudart_leave(g->device, prev);
    free(g->inflight);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void wh__gpu_unref(wh_gpu_t *g) {
    if (__atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) == 0) wh__gpu_free(g);
}

wh_gpu_t *wh_gpu_new(int device, wh_err_t *err) {
    if (!wh_cuda_init(device, err)) return NULL;
    wh_gpu_t *g = calloc(1, sizeof *g);
    if (!g) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    g->refs = 1;
    g->device = device;
    pthread_mutex_init(&g->mu, NULL);
    int prev = wh_cudart_enter(device);
    int rc = wh_cudart.StreamCreateWithFlags(&g->stream, WH_CUDA_STREAM_NON_BLOCKING);
    wh_cudart_leave(device, prev);
    if (rc != WH_CUDA_SUCCESS) {
        wh_cudart_fail(err, rc, "cudaStreamCreateWithFlags");
        g->stream = NULL;
        wh__gpu_free(g);
        return NULL;
    }
    return g;
}

void wh_gpu_destroy(wh_gpu_t *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    wh__inflight_t *fl = g->inflight;
    size_t n = g->ninflight;
    g->inflight = NULL;
    g->ninflight = g->capinflight = 0;
    pthread_mutex_unlock(&g->mu);
    if (n) {
        int prev = wh_cudart_enter(g->device);
        wh_cudart.StreamSynchronize(g->stream); /* host slots go back only after their copies */
        wh_cudart_leave(g->device, prev);
    }
    for (size_t i = 0; i < n; i++) {
        wh_buf_unref(fl[i].host);
        wh_buf_unref(&fl[i].dev->p.buf);
    }
    free(fl);
    wh__gpu_maps_drop(g, g->maps, g->nmaps);
    g->nmaps = 0;
    for (size_t i = 0; i < g->nslots; i++) wh__gpu_reg_drop(g->slots[i]); /* the stream is idle */
    free(g->slots);
    g->slots = NULL;
    g->nslots = 0;
    wh__gpu_unref(g);
}

/* Retires completed copies in order; mutex held, device entered. */
static void wh__poll_locked(wh_gpu_t *g, wh_buf_t **drop, size_t *ndrop) {
    size_t k = 0;
    for (; k < g->ninflight; k++) {
        if (wh_cudart.EventQuery(g->inflight[k].dev->copy_ev) != WH_CUDA_SUCCESS) {
            wh_cudart_clear(); /* "not ready" is pending as an error too */
            break;
        }
        float ms = 0;
        if (wh_cudart.EventElapsedTime(&ms, g->inflight[k].dev->start_ev,
                                       g->inflight[k].dev->copy_ev) != WH_CUDA_SUCCESS)
            wh_cudart_clear();
        else if (ms > 0)
            g->stats.copy_ns += (uint64_t)(ms * 1e6);
        drop[(*ndrop)++] = g->inflight[k].host;
        drop[(*ndrop)++] = &g->inflight[k].dev->p.buf;
    }
    if (k) {
        memmove(g->inflight, g->inflight + k, (g->ninflight - k) * sizeof *g->inflight);
        g->ninflight -= k;
    }
}

/* Unrefs outside the mutex: a release takes it again. */
static void wh__drop_all(wh_buf_t **drop, size_t n) {
    for (size_t i = 0; i < n; i++) wh_buf_unref(drop[i]);
}

void wh_gpu_poll(wh_gpu_t *g) {
    pthread_mutex_lock(&g->mu);
    size_t cap = 2 * g->ninflight, n = 0;
    wh_buf_t **drop = cap ? malloc(cap * sizeof *drop) : NULL;
    if (drop) {
        int prev = wh_cudart_enter(g->device);
        wh__poll_locked(g, drop, &n);
        wh_cudart_leave(g->device, prev);
    }
    pthread_mutex_unlock(&g->mu);
    wh__drop_all(drop, n);
    free(drop);
}

static void wh__gbuf_release(wh_buf_t *b) {
    wh__gbuf_t *x = (wh__gbuf_t *)b;
    wh_gpu_t *g = x->g;
    pthread_mutex_lock(&g->mu);
    x->busy = false;
    x->buf.refs = 1;
    pthread_mutex_unlock(&g->mu);
    wh__gpu_unref(g);
}

wh_buf_t *wh_gpu_pinned(wh_gpu_t *g, size_t size, wh_err_t *err) {
    wh_gpu_poll(g);
    pthread_mutex_lock(&g->mu);
    wh__hbuf_t *h = NULL;
    for (wh__hbuf_t *x = g->hbufs; x; x = x->next)
        if (!x->p.busy && x->p.cap >= size && (!h || x->p.cap < h->p.cap)) h = x;
    if (!h) {
        h = calloc(1, sizeof *h);
        void *p = h ? wh_cuda_host_alloc((void *)(intptr_t)g->device, WH_ALIGN_UP(size)) : NULL;
        if (!p) {
            free(h);
            pthread_mutex_unlock(&g->mu);
            return wh_err_set(err, WH_E_CUDA,
                              "CUDA: cannot allocate %zu bytes of page-locked "
                              "host memory (cudaHostAlloc)",
                              size),
                   NULL;
        }
        h->p.g = g;
        h->p.cap = WH_ALIGN_UP(size);
        h->p.buf.data = p;
        h->p.buf.device_type = 3; /* kDLCUDAHost */
        h->p.buf.device_id = 0;
        h->p.buf.release = wh__gbuf_release;
        h->p.buf.owner = g;
        h->next = g->hbufs;
        g->hbufs = h;
        g->stats.pinned_bufs++;
    }
    h->p.busy = true;
    h->p.buf.refs = 1;
    h->p.buf.size = size;
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g->mu);
    return &h->p.buf;
}

/* A free device buffer of at least size bytes; mutex held, device entered. */
static wh__dbuf_t *wh__dbuf_take(wh_gpu_t *g, size_t size, wh_err_t *err) {
    wh__dbuf_t *d = NULL;
    for (wh__dbuf_t *x = g->dbufs; x; x = x->next)
        if (!x->p.busy && x->p.cap >= size && x->p.cap <= 2 * size + 4096 &&
            (!d || x->p.cap < d->p.cap))
            d = x;
    if (!d) {
        d = calloc(1, sizeof *d);
        if (!d) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
        int rc = wh_cudart.Malloc(&d->p.buf.data, WH_ALIGN_UP(size ? size : 1));
        if (rc == WH_CUDA_SUCCESS)
            rc = wh_cudart.EventCreateWithFlags(&d->start_ev, WH_CUDA_EVENT_DEFAULT);
        if (rc == WH_CUDA_SUCCESS)
            rc = wh_cudart.EventCreateWithFlags(&d->copy_ev, WH_CUDA_EVENT_DEFAULT);
        if (rc != WH_CUDA_SUCCESS) {
            if (d->start_ev) wh_cudart.EventDestroy(d->start_ev);
            if (d->p.buf.data) wh_cudart.Free(d->p.buf.data);
            free(d);
            wh_err_set(err, WH_E_CUDA,
                       "CUDA: cannot allocate a %zu-byte device buffer on "
                       "device %d: %s",
                       size, g->device, wh_cudart_str(rc));
            return NULL;
        }
        d->p.g = g;
        d->p.cap = WH_ALIGN_UP(size ? size : 1);
        d->p.buf.device_type = 2; /* kDLCUDA */
        d->p.buf.device_id = g->device;
        d->p.buf.release = wh__gbuf_release;
        d->p.buf.owner = g;
        d->next = g->dbufs;
        g->dbufs = d;
        g->stats.device_bufs++;
        g->stats.device_bytes += d->p.cap;
    }
    return d;
}

typedef struct {
    wh_gpu_t *g;
    char *dev;
} wh__issue_t;

static int wh__issue_put(void *ctx, uint64_t at, const char *src, uint64_t len, bool row) {
    (void)row;
    wh__issue_t *c = ctx;
    c->g->stats.copies++;
    return wh_cudart.MemcpyAsync(c->dev + at, src, len, WH_CUDA_MEMCPY_H2D, c->g->stream);
}

/* The copies of one batch on the stage's stream (device entered): the
 * direct fields row by row from the store, everything between them from
 * host in one copy per run; b NULL: host[0, size) in one copy. */
static int wh__issue(wh_gpu_t *g, char *dev, const wh_buf_t *host, size_t size,
                     const wh_batch_t *b) {
    if (!b || !b->direct) {
        g->stats.copies++;
        return wh_cudart.MemcpyAsync(dev, host->data, size, WH_CUDA_MEMCPY_H2D, g->stream);
    }
    wh__issue_t c = {g, dev};
    return wh_batch_parts(b, host->data, size, wh__issue_put, &c);
}

wh_buf_t *wh__gpu_copy(wh_gpu_t *g, wh_buf_t *host, size_t size, const wh_batch_t *b,
                       wh_err_t *err) {
    size_t from = b && b->direct ? b->hsize : size;
    if (from > host->size)
        return wh_err_set(err, WH_E_INVALID, "copy of %zu bytes from a %zu-byte buffer", from,
                          host->size),
               NULL;
    wh_gpu_poll(g);
    pthread_mutex_lock(&g->mu);
    int prev = wh_cudart_enter(g->device);
    wh__dbuf_t *d = NULL;
    bool ok = true;
    if (g->ninflight == g->capinflight) {
        size_t nc = g->capinflight ? 2 * g->capinflight : 8;
        wh__inflight_t *ni = realloc(g->inflight, nc * sizeof *ni);
        if (!ni)
            ok = wh_err_set(err, WH_E_SYS, "out of memory");
        else {
            g->inflight = ni;
            g->capinflight = nc;
        }
    }
    if (ok) d = wh__dbuf_take(g, size, err);
    if (d) {
        /* the buffer's previous consumers must be done before it is overwritten */
        int rc = WH_CUDA_SUCCESS;
        for (int i = 0; i < d->ncons && rc == WH_CUDA_SUCCESS; i++)
            rc = wh_cudart.StreamWaitEvent(g->stream, d->cons_ev[i], 0);
        if (rc == WH_CUDA_SUCCESS) rc = wh_cudart.EventRecord(d->start_ev, g->stream);
        if (rc == WH_CUDA_SUCCESS) rc = wh__issue(g, d->p.buf.data, host, size, b);
        if (rc == WH_CUDA_SUCCESS) rc = wh_cudart.EventRecord(d->copy_ev, g->stream);
        if (rc != WH_CUDA_SUCCESS) {
            ok = wh_cudart_fail(err, rc, "the host-to-device copy (cudaMemcpyAsync)");
            wh_cudart_clear();
            /* rows queued before it read host and the store's views, which
             * the caller lets go on this error */
            wh_cudart.StreamSynchronize(g->stream);
            d = NULL;
        }
    }
    if (d) {
        d->p.busy = true;
        d->p.buf.size = size;
        d->p.buf.refs = 2; /* the caller's and the in-flight entry's */
        __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
        wh_buf_ref(host);
        g->inflight[g->ninflight++] = (wh__inflight_t){host, d, size};
        g->stats.h2d_bytes += size;
    }
    wh_cudart_leave(g->device, prev);
    pthread_mutex_unlock(&g->mu);
    return d ? &d->p.buf : NULL;
}

wh_buf_t *wh_gpu_copy(wh_gpu_t *g, wh_buf_t *host, size_t size, wh_err_t *err) {
    return wh__gpu_copy(g, host, size, NULL, err);
}

void wh_gpu_set_staged(wh_gpu_t *g, const char *why) {
    pthread_mutex_lock(&g->mu);
    snprintf(g->stats.staged_why, sizeof g->stats.staged_why, "%s", why);
    pthread_mutex_unlock(&g->mu);
}

void wh__gpu_host_copied(wh_gpu_t *g, uint64_t bytes) {
    pthread_mutex_lock(&g->mu);
    g->stats.host_copy_bytes += bytes;
    pthread_mutex_unlock(&g->mu);
}

wh_buf_t *wh__gpu_gather(wh_gpu_t *g, const wh_batch_t *b, const char *host, wh_buf_t *held,
                         wh_err_t *err) {
    wh_buf_t *h = wh_gpu_pinned(g, b->size, err);
    if (!h) return NULL;
    uint64_t rows = 0;
    /* each row's file checked after the copy, then the slot's, if any */
    if (b->n) wh_fault_cut("gather", b->views[0]->data);
    wh_buf_t *dev = NULL;
    if (wh_batch_gather(b, host, h->data, &rows, err) &&
        (!held || wh_ring_held_intact(held, err))) {
        wh__gpu_host_copied(g, rows);
        dev = wh__gpu_copy(g, h, b->size, NULL, err);
    }
    wh_buf_unref(h); /* the stage holds it until the copy's event */
    return dev;
}

wh_buf_t *wh_gpu_copy_batch(wh_gpu_t *g, const wh_batch_t *b, bool *refused, wh_err_t *err) {
    *refused = false;
    if (!b->direct) return wh__gpu_copy(g, b->buf, b->buf->size, NULL, err);
    wh_err_t e = {0};
    if (g->refused || !wh__gpu_maps_for(g, b, &e)) {
        if (!g->refused && e.code != WH_E_CUDA) {
            if (err) *err = e;
            return NULL;
        }
        /* refused: these rows go the staged way, and so do later batches
         * (those filled for this path already are not registered again) */
        if (!g->refused) {
            g->refused = true;
            *refused = true;
            wh_gpu_set_staged(g, e.message);
        }
        /* the batch whole in page-locked memory: its host part and its rows */
        return wh__gpu_gather(g, b, b->buf->data, NULL, err);
    }
    return wh__gpu_copy(g, b->buf, b->size, b, err);
}

wh_buf_t *wh_gpu_copy_slot(wh_gpu_t *g, wh_buf_t *held, bool *direct_out, wh_err_t *err) {
    *direct_out = false;
    wh_buf_t *m = wh_ring_slot_map(held);
    pthread_mutex_lock(&g->mu);
    wh__gpu_slots_sweep(g);
    bool direct = m && !g->slots_refused;
    wh_err_t e = {0};
    if (direct && !wh__gpu_slot_registered(g, m, &e)) {
        direct = false;
        if (e.code != WH_E_CUDA) {
            pthread_mutex_unlock(&g->mu);
            if (err) *err = e;
            return NULL;
        }
        g->slots_refused = true;
        snprintf(g->stats.staged_why, sizeof g->stats.staged_why, "%s", e.message);
    } else if (m && !direct) {
        wh_buf_unref(m);
    }
    pthread_mutex_unlock(&g->mu);
    if (direct) {
        wh_buf_t *dev = wh__gpu_copy(g, held, held->size, NULL, err);
        *direct_out = dev != NULL;
        return dev;
    }
    /* staged: one host copy into page-locked memory, counted, then the
     * slot file checked: a cut under the copy read zero pages */
    wh_buf_t *h = wh_gpu_pinned(g, held->size, err);
    if (!h) return NULL;
    wh_fault_cut("slot-copy", held->data);
    memcpy(h->data, held->data, held->size);
    if (!wh_ring_held_intact(held, err)) {
        wh_buf_unref(h);
        return NULL;
    }
    wh__gpu_host_copied(g, held->size);
    wh_buf_t *dev = wh__gpu_copy(g, h, held->size, NULL, err);
    wh_buf_unref(h); /* the stage holds it until the copy's event */
    return dev;
}

void wh_gpu_stats(wh_gpu_t *g, wh_gpu_stats_t *out) {
    wh_gpu_poll(g);
    pthread_mutex_lock(&g->mu);
    *out = g->stats;
    pthread_mutex_unlock(&g->mu);
    out->registrations = wh__gpu_registrations();
}

static bool wh__stream_ok(intptr_t stream, wh_err_t *err) {
    if (stream == 0)
        return wh_err_set(err, WH_E_INVALID,
                          "__dlpack__: stream=0 is ambiguous for CUDA (the array API forbids "
                          "it): pass 1 for the legacy default stream, 2 for the per-thread "
                          "default stream, or a stream pointer");
    if (stream < -1)
        return wh_err_set(err, WH_E_INVALID, "__dlpack__: stream=%lld is not a CUDA stream",
                          (long long)stream);
    return true;
}

bool wh_gpu_export(wh_buf_t *b, intptr_t stream, wh_err_t *err) {
    if (!wh__stream_ok(stream, err)) return false;
    if (stream == -1) return true; /* the consumer synchronises itself */
    wh__dbuf_t *d = (wh__dbuf_t *)b;
    wh_gpu_t *g = d->p.g;
    int prev = wh_cudart_enter(g->device);
    int rc = wh_cudart.StreamWaitEvent((wh_cstream_t)stream, d->copy_ev, 0);
    wh_cudart_leave(g->device, prev);
    if (rc != WH_CUDA_SUCCESS)
        return wh_cudart_fail(err, rc, "cudaStreamWaitEvent on the consumer's stream");
    pthread_mutex_lock(&g->mu);
    g->stats.stream_waits++;
    pthread_mutex_unlock(&g->mu);
    return true;
}

void wh_gpu_exported_done(wh_buf_t *b, intptr_t stream) {
    wh__dbuf_t *d = (wh__dbuf_t *)b;
    wh_gpu_t *g = d->p.g;
    if (stream == -1 || stream == 0) stream = 1; /* unknown: the legacy default stream */
    pthread_mutex_lock(&g->mu);
    int prev = wh_cudart_enter(g->device);
    int i = 0;
    while (i < d->ncons && d->cons_stream[i] != stream) i++;
    if (i == d->ncons && i == WH__MAX_CONSUMERS) {
        /* too many streams to track: wait for the oldest on the host instead */
        uint64_t t0 = wh_now_mono_ns();
        wh_cudart.EventSynchronize(d->cons_ev[0]);
        g->stats.host_wait_ns += wh_now_mono_ns() - t0;
        wh_cudart.EventDestroy(d->cons_ev[0]);
        memmove(d->cons_ev, d->cons_ev + 1, (WH__MAX_CONSUMERS - 1) * sizeof *d->cons_ev);
        memmove(d->cons_stream, d->cons_stream + 1,
                (WH__MAX_CONSUMERS - 1) * sizeof *d->cons_stream);
        i = --d->ncons;
        g->stats.host_waits++;
    }
    if (i == d->ncons) {
        if (wh_cudart.EventCreateWithFlags(&d->cons_ev[i], 2 /* cudaEventDisableTiming */) ==
            WH_CUDA_SUCCESS) {
            d->cons_stream[i] = stream;
            d->ncons++;
        } else {
            wh_cudart.StreamSynchronize((wh_cstream_t)stream); /* no event: order on the host */
            i = -1;
        }
    }
    /* re-recording on the same stream supersedes the earlier release */
    if (i >= 0 && wh_cudart.EventRecord(d->cons_ev[i], (wh_cstream_t)stream) != WH_CUDA_SUCCESS)
        wh_cudart.StreamSynchronize((wh_cstream_t)stream);
    wh_cudart_leave(g->device, prev);
    pthread_mutex_unlock(&g->mu);
}
