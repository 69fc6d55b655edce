/* The GPU stage (see wh_cuda.h) over the runtime loaded by wh_cudart.c. */
#define _GNU_SOURCE
#include "wh_cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wh_fault.h"
#include "wh_ring.h"

/* ---- the GPU stage ---- */

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

typedef struct {
    wh_buf_t *host;
    wh__dbuf_t *dev;
    size_t size;
} wh__inflight_t;

/* ---- store mappings registered in place, one registration per process
 * and mapping, shared by every stage ---- */

enum {
    WH__MAX_MAPS = 4 /* mappings one batch's rows may come from */
};

typedef struct wh__reg {
    void *map; /* wh_store_view_map's reference: keeps the mapping mapped */
    void *base;
    size_t len;
    uint32_t users;          /* stages using it */
    void (*drop)(void *map); /* lets go of map (after the unregister) */
    struct wh__reg *next;
} wh__reg_t;

static pthread_mutex_t wh__reg_mu = PTHREAD_MUTEX_INITIALIZER;
static wh__reg_t *wh__regs;
static uint64_t wh__registrations;

bool wh_cuda_can_register(void) { return wh_cudart.HostRegister != NULL; }

/* One more user of map's registration, registering it on first use. Takes
 * over the caller's map reference (drop lets go of it); what names the
 * mapping in messages. Registers on device. */
static bool wh__reg_take(void *map, const void *base, size_t len, void (*drop)(void *),
                         const char *what, int device, wh_err_t *err) {
    pthread_mutex_lock(&wh__reg_mu);
    wh__reg_t *r = wh__regs;
    while (r && r->map != map) r = r->next;
    if (r) {
        r->users++;
        pthread_mutex_unlock(&wh__reg_mu);
        drop(map);
        return true;
    }
    r = calloc(1, sizeof *r);
    int rc = -1;
    if (r) {
        unsigned flags = WH_CUDA_HOST_REGISTER_PORTABLE;
        if (wh_cuda_runtime_version() >= WH_CUDA_READ_ONLY_VERSION)
            flags |= WH_CUDA_HOST_REGISTER_READ_ONLY; /* the store's mapping is read-only */
        int prev = wh_cudart_enter(device);
        rc = wh_cudart.HostRegister((void *)base, len, flags);
        if (rc != WH_CUDA_SUCCESS) wh_cudart_clear();
        wh_cudart_leave(device, prev);
    }
    if (rc != WH_CUDA_SUCCESS) {
        pthread_mutex_unlock(&wh__reg_mu);
        free(r);
        drop(map);
        if (rc == -1) return wh_err_set(err, WH_E_SYS, "out of memory");
        return wh_err_set(err, WH_E_CUDA,
                          "cudaHostRegister of %s %zu-byte mapping was refused: %s "
                          "(error %d; the locked-memory limit, ulimit -l / RLIMIT_MEMLOCK, may "
                          "be below its size)",
                          what, len, wh_cudart_str(rc), rc);
    }
    r->map = map;
    r->base = (void *)base;
    r->len = len;
    r->users = 1;
    r->drop = drop;
    r->next = wh__regs;
    wh__regs = r;
    wh__registrations++;
    pthread_mutex_unlock(&wh__reg_mu);
    return true;
}

/* One user fewer; the last unregisters (no copy from it may be pending). */
static void wh__reg_drop(void *map) {
    pthread_mutex_lock(&wh__reg_mu);
    wh__reg_t **rr = &wh__regs;
    while (*rr && (*rr)->map != map) rr = &(*rr)->next;
    wh__reg_t *r = *rr;
    if (r && --r->users == 0) {
        *rr = r->next;
        if (wh_cudart.HostUnregister(r->base) != WH_CUDA_SUCCESS) wh_cudart_clear();
    } else {
        r = NULL;
    }
    pthread_mutex_unlock(&wh__reg_mu);
    if (r) {
        r->drop(r->map);
        free(r);
    }
}

static void wh__store_map_drop(void *map) { wh_store_map_unref(map); }

static void wh__slot_map_drop(void *map) { wh_buf_unref(map); }

struct wh_gpu {
    uint64_t refs; /* 1 for the owner, 1 per busy buffer */
    int device;
    pthread_mutex_t mu;
    wh_cstream_t stream;
    wh__dbuf_t *dbufs;
    wh__hbuf_t *hbufs;
    wh__inflight_t *inflight; /* FIFO in issue order (one stream: completes in order) */
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

/* Stops using the registrations in maps[0, n): after every copy queued on
 * the stage's stream (some may read them) has completed. */
static void wh__maps_drop(wh_gpu_t *g, void **maps, int n) {
    if (!n) return;
    int prev = wh_cudart_enter(g->device);
    wh_cudart.StreamSynchronize(g->stream);
    wh_cudart_leave(g->device, prev);
    for (int i = 0; i < n; i++) wh__reg_drop(maps[i]);
}

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
    wh__maps_drop(g, g->maps, g->nmaps);
    g->nmaps = 0;
    for (size_t i = 0; i < g->nslots; i++) wh__reg_drop(g->slots[i]); /* the stream is idle */
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

static wh_buf_t *wh__copy(wh_gpu_t *g, wh_buf_t *host, size_t size, const wh_batch_t *b,
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
    return wh__copy(g, host, size, NULL, err);
}

void wh_gpu_set_staged(wh_gpu_t *g, const char *why) {
    pthread_mutex_lock(&g->mu);
    snprintf(g->stats.staged_why, sizeof g->stats.staged_why, "%s", why);
    pthread_mutex_unlock(&g->mu);
}

/* The registrations b's rows need, taken before its copies are queued.
 * One the stage used before and b does not is kept while the mapping is in
 * use (the loader's threads move to a segment made again one by one, so
 * batches alternate between the two for a while) and dropped once only the
 * registration holds it, or when the stage needs the room. */
static bool wh__maps_for(wh_gpu_t *g, const wh_batch_t *b, wh_err_t *err) {
    void *want[WH__MAX_MAPS];
    const void *base[WH__MAX_MAPS];
    size_t len[WH__MAX_MAPS];
    int n = 0;
    bool ok = true;
    for (uint32_t i = 0; i < b->n && ok; i++) {
        const void *bs;
        size_t ln;
        void *m = wh_store_view_map(b->views[i], &bs, &ln);
        if (!m) {
            ok = wh_err_set(err, WH_E_INVALID, "row %u of the batch is not a store view", i);
            break;
        }
        int k = 0;
        while (k < n && want[k] != m) k++;
        if (k < n || n == WH__MAX_MAPS) {
            wh_store_map_unref(m);
            if (k == n) ok = wh_err_set(err, WH_E_INVALID, "a batch's rows span too many mappings");
            continue;
        }
        want[n] = m;
        base[n] = bs;
        len[n++] = ln;
    }
    /* new registrations first, then let go of the old */
    void *keep[WH__MAX_MAPS], *gone[WH__MAX_MAPS];
    int nkeep = 0, ngone = 0;
    for (int k = 0; k < n; k++) {
        int j = 0;
        while (j < g->nmaps && g->maps[j] != want[k]) j++;
        if (j < g->nmaps) {
            wh_store_map_unref(want[k]); /* already a user */
            keep[nkeep++] = want[k];
        } else if (!ok) {
            wh_store_map_unref(want[k]);
        } else if (wh__reg_take(want[k], base[k], len[k], wh__store_map_drop, "the store's",
                                g->device, err)) {
            keep[nkeep++] = want[k];
        } else {
            ok = false;
        }
    }
    for (int j = 0; j < g->nmaps; j++) {
        int k = 0;
        while (k < nkeep && keep[k] != g->maps[j]) k++;
        if (k < nkeep) continue;
        if (ok && nkeep < WH__MAX_MAPS && wh_store_map_in_use(g->maps[j]))
            keep[nkeep++] = g->maps[j];
        else
            gone[ngone++] = g->maps[j];
    }
    memcpy(g->maps, keep, (size_t)nkeep * sizeof *keep);
    g->nmaps = nkeep;
    wh__maps_drop(g, gone, ngone);
    return ok;
}

wh_buf_t *wh_gpu_copy_batch(wh_gpu_t *g, const wh_batch_t *b, bool *refused, wh_err_t *err) {
    *refused = false;
    if (!b->direct) return wh__copy(g, b->buf, b->buf->size, NULL, err);
    wh_err_t e = {0};
    if (g->refused || !wh__maps_for(g, b, &e)) {
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
        wh_buf_t *h = wh_gpu_pinned(g, b->size, err);
        uint64_t rows = 0;
        if (h && b->n) wh_fault_cut("gather", b->views[0]->data);
        if (h && !wh_batch_gather(b, b->buf->data, h->data, &rows, err)) {
            wh_buf_unref(h);
            h = NULL;
        }
        if (!h) return NULL;
        pthread_mutex_lock(&g->mu);
        g->stats.host_copy_bytes += rows;
        pthread_mutex_unlock(&g->mu);
        wh_buf_t *dev = wh__copy(g, h, b->size, NULL, err);
        wh_buf_unref(h); /* the stage holds it until the copy's event */
        return dev;
    }
    return wh__copy(g, b->buf, b->size, b, err);
}

/* Lets go of slot mappings only this stage's registration still holds: the
 * ring moved on to a grown version, or was closed, and no batch over them
 * (so no copy from them, which holds its batch) is left. */
static void wh__slots_sweep(wh_gpu_t *g) {
    size_t k = 0;
    for (size_t i = 0; i < g->nslots; i++) {
        wh_buf_t *m = g->slots[i];
        if (__atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 1)
            wh__reg_drop(m);
        else
            g->slots[k++] = m;
    }
    g->nslots = k;
}

/* Whether m is registered for this stage, registering it on first use;
 * takes over the reference m. */
static bool wh__slot_registered(wh_gpu_t *g, wh_buf_t *m, wh_err_t *err) {
    for (size_t i = 0; i < g->nslots; i++)
        if (g->slots[i] == m) {
            wh_buf_unref(m);
            return true;
        }
    if (g->nslots == g->capslots) {
        size_t nc = g->capslots ? 2 * g->capslots : 16;
        wh_buf_t **ns = realloc(g->slots, nc * sizeof *ns);
        if (!ns) {
            wh_buf_unref(m);
            return wh_err_set(err, WH_E_SYS, "out of memory");
        }
        g->slots = ns;
        g->capslots = nc;
    }
    if (!wh__reg_take(m, m->data, m->size, wh__slot_map_drop, "a ring slot file's", g->device, err))
        return false;
    g->slots[g->nslots++] = m;
    return true;
}

wh_buf_t *wh_gpu_copy_slot(wh_gpu_t *g, wh_buf_t *held, bool *direct_out, wh_err_t *err) {
    *direct_out = false;
    wh_buf_t *m = wh_ring_slot_map(held);
    pthread_mutex_lock(&g->mu);
    wh__slots_sweep(g);
    bool direct = m && !g->slots_refused;
    wh_err_t e = {0};
    if (direct && !wh__slot_registered(g, m, &e)) {
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
        wh_buf_t *dev = wh__copy(g, held, held->size, NULL, err);
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
    pthread_mutex_lock(&g->mu);
    g->stats.host_copy_bytes += held->size;
    pthread_mutex_unlock(&g->mu);
    wh_buf_t *dev = wh__copy(g, h, held->size, NULL, err);
    wh_buf_unref(h); /* the stage holds it until the copy's event */
    return dev;
}

/* ---- the hand-over of positions (wh_gpu_copy_slot_rows) ---- */

/* Keeps a claimed slot and its rows' store views until the copy's event. */
typedef struct {
    wh_buf_t buf; /* over the slot's bytes */
    wh_buf_t *held;
    uint32_t n;
    wh_buf_t *views[];
} wh__rowhold_t;

static void wh__rowhold_release(wh_buf_t *b) {
    wh__rowhold_t *h = b->owner;
    for (uint32_t i = 0; i < h->n; i++) wh_buf_unref(h->views[i]);
    wh_buf_unref(h->held);
    free(h);
}

/* Each row's generation, position and padding flag as the slot names
 * them: read out of shared memory once, and checked, before any use. */
typedef struct {
    uint64_t *gen;
    uint32_t *pos;
    uint8_t *pad;
} wh__rows_at_t;

typedef struct {
    const wh__rows_at_t *at;
    wh_gpu_t *g;
    wh_buf_t *h; /* page-locked memory of the batch read again */
} wh__reread_t;

static void wh__reread_at(void *ctx, uint32_t i, uint32_t *pos, bool *pad) {
    const wh__reread_t *c = ctx;
    *pos = c->at->pos[i];
    *pad = c->at->pad[i] != 0;
}

static void *wh__reread_mem(void *ctx, const wh_batch_t *b, wh_err_t *err) {
    wh__reread_t *c = ctx;
    if (c->h && c->h->size >= b->size) return c->h->data;
    wh_buf_unref(c->h);
    c->h = wh_gpu_pinned(c->g, b->size ? b->size : 1, err);
    return c->h ? c->h->data : NULL;
}

/* The batch read again in this process, as the worker read it: the rows'
 * positions and padding from the slot, from the first row's generation on
 * (a reclaimed one moves to the newest), checked; one copy. */
static wh_buf_t *wh__rows_reread(wh_gpu_t *g, const wh__rows_at_t *at, const wh_gpu_rows_t *rq,
                                 wh_err_t *err) {
    wh__reread_t c = {at, g, NULL};
    const wh_store_config_t *cfg = wh_store_config(rq->st);
    wh_batch_fill_t f = {0};
    f.st = rq->st;
    f.schema = &cfg->schema;
    f.n = rq->n;
    f.want = rq->want;
    f.timeout_s = rq->timeout_s;
    f.strict = rq->strict;
    f.at = wh__reread_at;
    f.at_ctx = &c;
    f.mem = wh__reread_mem;
    f.mem_ctx = &c;
    f.ignore_fields = rq->ignore_fields;
    f.ignore_int = rq->ignore_int;
    f.ignore_float = rq->ignore_float;
    wh_batch_t b;
    void *data;
    wh_batch_stats_t st;
    wh_buf_t *dev = NULL;
    bool ok = wh_batch_fill(&f, at->gen[0], &b, &data, &st, err);
    for (int k = 0; ok && k < rq->nfields; k++) {
        if (!(rq->want & (1u << k)) || (b.off[k] == rq->off[k] && b.meta[k].nbytes == rq->row[k]))
            continue;
        ok = wh_err_set(err, WH_E_INVALID,
                        "field '%s': generation %llu holds samples of %llu bytes where the "
                        "batch's worker read %llu; samples stacked in one batch need one shape",
                        cfg->schema.names[k], (unsigned long long)st.gen,
                        (unsigned long long)b.meta[k].nbytes, (unsigned long long)rq->row[k]);
    }
    if (ok && b.size != rq->size)
        ok = wh_err_set(err, WH_E_INVALID, "the batch read again has %llu bytes, not %llu",
                        (unsigned long long)b.size, (unsigned long long)rq->size);
    if (ok) dev = wh__copy(g, c.h, b.size, NULL, err);
    if (dev) {
        pthread_mutex_lock(&g->mu);
        g->stats.host_copy_bytes += st.host_bytes;
        g->stats.rereads++;
        pthread_mutex_unlock(&g->mu);
    }
    wh_buf_unref(c.h); /* the stage holds it until the copy's event */
    return dev;
}

/* Views of every row's large fields, by the generation and position the
 * slot names; false (nothing held) when one is not the sample the worker
 * read any more, or an error other than a read's (*fatal). */
static bool wh__rows_view(const wh_gpu_rows_t *rq, const wh__rows_at_t *at, wh__rowhold_t *hold,
                          const char **src, bool *fatal, wh_err_t *err) {
    for (uint32_t i = 0; i < rq->n; i++) {
        uint64_t known[WH_MAX_FIELDS] = {0};
        memcpy(known, rq->sums + (size_t)i * (size_t)rq->nfields, (size_t)rq->nfields * 8);
        wh_sample_meta_t m;
        wh_err_t e = {0};
        if (!wh_store_view_known(rq->st, at->gen[i], at->pos[i], known, &hold->views[i], &m, &e)) {
            *fatal = e.code == WH_E_SYS || e.code == WH_E_INTERNAL;
            if (*fatal && err) *err = e;
            return false;
        }
        hold->n = i + 1;
        for (int f = 0; f < rq->nfields; f++) {
            if (!(rq->direct & (1u << f))) continue;
            if (f >= m.nfields || m.f[f].checksum != known[f] || m.f[f].nbytes != rq->row[f])
                return false;
            src[(size_t)i * WH_MAX_FIELDS + f] = (const char *)hold->views[i]->data + m.f[f].offset;
        }
    }
    return true;
}

wh_buf_t *wh_gpu_copy_slot_rows(wh_gpu_t *g, wh_buf_t *held, const wh_gpu_rows_t *rq,
                                bool *direct_out, bool *reread, wh_err_t *err) {
    *direct_out = *reread = false;
    if (rq->n < 1 || rq->nfields < 1 || rq->nfields > WH_MAX_FIELDS || !(rq->direct & rq->want) ||
        (rq->direct & ~rq->want))
        return wh_err_set(err, WH_E_INVALID, "copy_slot: no fields left in the store"), NULL;
    wh_batch_t b;
    memset(&b, 0, sizeof b);
    b.n = rq->n;
    b.nfields = rq->nfields;
    b.direct = rq->direct;
    for (int f = 0; f < rq->nfields; f++) {
        b.off[f] = rq->off[f];
        b.meta[f].nbytes = rq->row[f];
    }
    b.pad_off = rq->pad_off;
    b.gen_off = rq->gen_off;
    b.pos_off = rq->pos_off;
    b.pv_off = rq->pv_off;
    b.size = rq->size;
    /* the layout comes from the handle: the blocks in order, inside the
     * batch, and the slot's part the size of the slot claimed */
    uint64_t end = 0;
    bool fits = true;
    for (int f = 0; f < rq->nfields && fits; f++) {
        uint64_t part;
        if (!(rq->want & (1u << f))) continue;
        fits = b.off[f] >= end && wh_mul_ok(b.meta[f].nbytes, b.n, &part) &&
               wh_add_ok(b.off[f], WH_ALIGN_UP(part), &end);
    }
    fits = fits && b.size <= WH_SAMPLE_MAX_BYTES * 64 && end <= b.size && b.pad_off <= b.size &&
           b.gen_off <= b.size && b.pos_off <= b.size && b.pv_off <= b.size && b.pad_off >= end &&
           b.gen_off >= b.pad_off + b.n && b.pos_off >= b.gen_off + 8 * (uint64_t)b.n &&
           b.pv_off >= b.pos_off + 8 * (uint64_t)b.n && b.size >= b.pv_off + 8 * (uint64_t)b.n &&
           b.size <= WH_SAMPLE_MAX_BYTES * 64;
    b.hsize = fits ? wh_batch_host_off(&b, b.size) : 0;
    if (!fits || b.hsize != held->size)
        return wh_err_set(err, WH_E_INVALID,
                          "copy_slot: a batch layout (%llu bytes, %llu in the slot) that does "
                          "not fit its %zu-byte slot",
                          (unsigned long long)b.size, (unsigned long long)b.hsize, held->size),
               NULL;
    const char *slot = held->data;
    wh__rows_at_t at = {malloc(rq->n * sizeof *at.gen), malloc(rq->n * sizeof *at.pos),
                        malloc(rq->n)};
    wh__rowhold_t *hold = calloc(1, sizeof *hold + rq->n * sizeof(wh_buf_t *));
    const char **src = calloc((size_t)rq->n * WH_MAX_FIELDS, sizeof *src);
    wh_buf_t *dev = NULL;
    bool ok = at.gen && at.pos && at.pad && hold && src;
    if (!ok) wh_err_set(err, WH_E_SYS, "out of memory");
    uint64_t goff = wh_batch_host_off(&b, b.gen_off), poff = wh_batch_host_off(&b, b.pos_off),
             padoff = wh_batch_host_off(&b, b.pad_off);
    for (uint32_t i = 0; ok && i < rq->n; i++) {
        int64_t gen, pos;
        memcpy(&gen, slot + goff + 8 * (uint64_t)i, 8);
        memcpy(&pos, slot + poff + 8 * (uint64_t)i, 8);
        at.pad[i] = (uint8_t)slot[padoff + i];
        if (gen <= 0 || pos < 0 || pos > (int64_t)UINT32_MAX)
            ok = wh_err_set(err, WH_E_CORRUPT,
                            "row %u of a ring slot names generation %lld "
                            "position %lld",
                            i, (long long)gen, (long long)pos);
        at.gen[i] = (uint64_t)gen;
        at.pos[i] = (uint32_t)pos;
    }
    bool fatal = !ok;
    if (ok) wh_store_set_dma_views(rq->st, true);
    if (!ok || !wh__rows_view(rq, &at, hold, src, &fatal, err)) {
        for (uint32_t i = 0; hold && i < hold->n; i++) wh_buf_unref(hold->views[i]);
        free(hold);
        free(src);
        if (!fatal) {
            *reread = true;
            dev = wh__rows_reread(g, &at, rq, err);
        }
        free(at.gen);
        free(at.pos);
        free(at.pad);
        return dev;
    }
    free(at.gen);
    free(at.pos);
    free(at.pad);
    b.src = src;
    b.views = hold->views;
    hold->held = held;
    wh_buf_ref(held);
    hold->buf.refs = 1;
    hold->buf.data = held->data;
    hold->buf.size = held->size;
    hold->buf.device_type = 1;
    hold->buf.release = wh__rowhold_release;
    hold->buf.owner = hold;
    /* both mappings registered, or the batch gathered into page-locked memory */
    wh_err_t e = {0};
    bool direct = !g->refused && wh__maps_for(g, &b, &e);
    if (!direct && !g->refused && e.code == WH_E_CUDA) {
        g->refused = true;
        wh_gpu_set_staged(g, e.message);
    }
    wh_buf_t *m = direct ? wh_ring_slot_map(held) : NULL;
    pthread_mutex_lock(&g->mu);
    wh__slots_sweep(g);
    if (direct && (g->slots_refused || !m || !wh__slot_registered(g, m, &e))) {
        direct = false;
        if (e.code == WH_E_CUDA && !g->slots_refused) {
            g->slots_refused = true;
            snprintf(g->stats.staged_why, sizeof g->stats.staged_why, "%s", e.message);
        }
    } else if (m && !direct) {
        wh_buf_unref(m);
    }
    pthread_mutex_unlock(&g->mu);
    if (!direct && e.code && e.code != WH_E_CUDA) {
        if (err) *err = e;
    } else if (direct) {
        dev = wh__copy(g, &hold->buf, b.size, &b, err);
        *direct_out = dev != NULL;
    } else {
        wh_buf_t *h = wh_gpu_pinned(g, b.size, err);
        uint64_t rows = 0;
        /* the slot's part and the rows, each file checked after the copy */
        if (h) wh_fault_cut("gather", hold->views[0]->data);
        if (h && wh_batch_gather(&b, slot, h->data, &rows, err) && wh_ring_held_intact(held, err)) {
            pthread_mutex_lock(&g->mu);
            g->stats.host_copy_bytes += rows;
            pthread_mutex_unlock(&g->mu);
            dev = wh__copy(g, h, b.size, NULL, err);
        }
        wh_buf_unref(h); /* the stage holds it until the copy's event */
    }
    wh_buf_unref(&hold->buf); /* a queued copy holds its own reference */
    free(src);
    return dev;
}

void wh_gpu_stats(wh_gpu_t *g, wh_gpu_stats_t *out) {
    wh_gpu_poll(g);
    pthread_mutex_lock(&g->mu);
    *out = g->stats;
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_lock(&wh__reg_mu);
    out->registrations = wh__registrations;
    pthread_mutex_unlock(&wh__reg_mu);
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

/* ---- a loader's batches on the device ---- */

struct wh_gpu_feed {
    wh_gpu_t *g;
    wh_loader_t *ld;
    uint32_t depth, head, n;
    bool done;
    wh_batch_t *q;
    bool *pad;
};

wh_gpu_feed_t *wh_gpu_feed_new(wh_gpu_t *g, wh_loader_t *ld, uint32_t depth, wh_err_t *err) {
    wh_gpu_feed_t *f = calloc(1, sizeof *f);
    if (f) {
        f->q = calloc(depth ? depth : 1, sizeof *f->q);
        f->pad = calloc(depth ? depth : 1, sizeof *f->pad);
    }
    if (!f || !f->q || !f->pad) {
        if (f) free(f->q);
        free(f);
        return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    }
    f->g = g;
    f->ld = ld;
    f->depth = depth ? depth : 1;
    return f;
}

void wh_gpu_feed_reset(wh_gpu_feed_t *f) {
    for (; f->n; f->n--, f->head = (f->head + 1) % f->depth) wh_buf_unref(f->q[f->head].buf);
    f->head = 0;
    f->done = false;
}

void wh_gpu_feed_destroy(wh_gpu_feed_t *f) {
    if (!f) return;
    wh_gpu_feed_reset(f);
    free(f->q);
    free(f->pad);
    free(f);
}

bool wh_gpu_feed_next(wh_gpu_feed_t *f, unsigned wait_ms, wh_batch_t *out, bool *done,
                      bool *any_pad, wh_err_t *err) {
    *done = false;
    out->buf = NULL;
    wh_gpu_poll(f->g); /* slots whose copies completed go back to the ring first */
    /* issue the copies of every batch already read, up to depth ahead; block
     * (up to wait_ms) only when none is queued */
    while (!f->done && f->n < f->depth) {
        wh_batch_t b;
        bool d = false;
        if (!wh_loader_next(f->ld, f->n ? 0 : wait_ms, &b, &d, err)) {
            wh_gpu_feed_reset(f);
            return false;
        }
        if (d) {
            f->done = true;
            break;
        }
        if (!b.buf) break;
        bool pad = false;
        const char *flags = (const char *)b.buf->data + wh_batch_host_off(&b, b.pad_off);
        for (uint32_t i = 0; i < b.n; i++) pad |= flags[i] != 0;
        bool refused = false;
        wh_buf_t *dev = wh_gpu_copy_batch(f->g, &b, &refused, err);
        if (refused) wh_loader_stage_all(f->ld);
        wh_buf_unref(b.buf); /* the stage holds it (and its rows' views) until the copy's event */
        if (!dev) {
            wh_gpu_feed_reset(f);
            return wh_err_prefix(err, "batch %llu", (unsigned long long)b.index);
        }
        b.buf = dev;
        uint32_t slot = (f->head + f->n) % f->depth;
        f->q[slot] = b;
        f->pad[slot] = pad;
        f->n++;
    }
    if (!f->n) {
        *done = f->done;
        if (f->done) f->done = false;
        return true;
    }
    *out = f->q[f->head];
    *any_pad = f->pad[f->head];
    f->head = (f->head + 1) % f->depth;
    f->n--;
    return true;
}
