/* CUDA runtime through dlopen, and the GPU stage (see wh_cuda.h). Only the
 * functions and constants used are declared here, by hand, from the CUDA
 * runtime API reference; they have been stable since CUDA 4. */
#define _GNU_SOURCE
#include "wh_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the runtime ---- */

typedef void *wh__cstream_t;
typedef void *wh__cevent_t;

enum {
    WH__CUDA_SUCCESS = 0,
    WH__CUDA_ERR_INSUFFICIENT_DRIVER = 35,
    WH__CUDA_ERR_NO_DEVICE = 100,
    WH__CUDA_ERR_NOT_READY = 600,
    WH__CUDA_MEMCPY_H2D = 1,
    WH__CUDA_STREAM_NON_BLOCKING = 1,
    WH__CUDA_EVENT_DEFAULT = 0,
    WH__CUDA_HOST_ALLOC_PORTABLE = 1,
    WH__CUDA_MIN_VERSION = 11000, /* CUDA 11.0 */
};

typedef struct {
    int (*GetDeviceCount)(int *);
    int (*GetDevice)(int *);
    int (*SetDevice)(int);
    int (*RuntimeGetVersion)(int *);
    int (*DriverGetVersion)(int *);
    const char *(*GetErrorString)(int);
    int (*HostAlloc)(void **, size_t, unsigned);
    int (*FreeHost)(void *);
    int (*Malloc)(void **, size_t);
    int (*Free)(void *);
    int (*MemcpyAsync)(void *, const void *, size_t, int, wh__cstream_t);
    int (*StreamCreateWithFlags)(wh__cstream_t *, unsigned);
    int (*StreamDestroy)(wh__cstream_t);
    int (*StreamSynchronize)(wh__cstream_t);
    int (*StreamWaitEvent)(wh__cstream_t, wh__cevent_t, unsigned);
    int (*EventCreateWithFlags)(wh__cevent_t *, unsigned);
    int (*EventDestroy)(wh__cevent_t);
    int (*EventRecord)(wh__cevent_t, wh__cstream_t);
    int (*EventQuery)(wh__cevent_t);
    int (*EventSynchronize)(wh__cevent_t);
    int (*EventElapsedTime)(float *, wh__cevent_t, wh__cevent_t);
} wh__cuda_api_t;

static wh__cuda_api_t wh__cu;
static pthread_mutex_t wh__cu_mu = PTHREAD_MUTEX_INITIALIZER;
static bool wh__cu_loaded;
static char wh__cu_name[256];
static int wh__cu_version;
static pid_t wh__cu_pid; /* CUDA state does not survive fork */

static const char *wh__cu_str(int rc) {
    const char *s = wh__cu.GetErrorString ? wh__cu.GetErrorString(rc) : NULL;
    return s ? s : "unknown CUDA error";
}

static bool wh__cu_fail(wh_err_t *err, int rc, const char *what) {
    return wh_err_set(err, WH_E_CUDA, "CUDA: %s failed: %s (error %d)", what, wh__cu_str(rc), rc);
}

static void *wh__open_lib(char *tried, size_t cap) {
    const char *env = getenv("WIREHEAD_CUDA_LIB");
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(tried, cap, "WIREHEAD_CUDA_LIB=%s cannot be loaded: %s", env, dlerror());
        else snprintf(wh__cu_name, sizeof wh__cu_name, "%s", env);
        return h;
    }
    static const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                  "libcudart.so"};
    /* first a copy already loaded (torch's), so the process has one runtime */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < WH_ARRAY_LEN(names); i++) {
            void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | (pass ? 0 : RTLD_NOLOAD));
            if (h) {
                snprintf(wh__cu_name, sizeof wh__cu_name, "%s", names[i]);
                return h;
            }
        }
    snprintf(tried, cap,
             "no CUDA runtime library is loaded or loadable (tried libcudart.so.13, .so.12, "
             ".so.11.0, .so); import a CUDA build of torch first, install the CUDA runtime, "
             "or set WIREHEAD_CUDA_LIB to the path of libcudart");
    return NULL;
}

static bool wh__load(wh_err_t *err) {
    char msg[WH_ERR_LEN];
    void *h = wh__open_lib(msg, sizeof msg);
    if (!h) return wh_err_set(err, WH_E_CUDA, "CUDA: %s", msg);
    wh__cuda_api_t api;
    struct {
        void **slot;
        const char *name;
    } syms[] = {
#define WH__SYM(f) {(void **)&api.f, "cuda" #f}
        WH__SYM(GetDeviceCount), WH__SYM(GetDevice), WH__SYM(SetDevice),
        WH__SYM(RuntimeGetVersion), WH__SYM(DriverGetVersion), WH__SYM(GetErrorString),
        WH__SYM(HostAlloc), WH__SYM(FreeHost), WH__SYM(Malloc), WH__SYM(Free),
        WH__SYM(MemcpyAsync), WH__SYM(StreamCreateWithFlags), WH__SYM(StreamDestroy),
        WH__SYM(StreamSynchronize), WH__SYM(StreamWaitEvent), WH__SYM(EventCreateWithFlags),
        WH__SYM(EventDestroy), WH__SYM(EventRecord), WH__SYM(EventQuery),
        WH__SYM(EventSynchronize), WH__SYM(EventElapsedTime),
#undef WH__SYM
    };
    for (size_t i = 0; i < WH_ARRAY_LEN(syms); i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (!*syms[i].slot)
            return wh_err_set(err, WH_E_CUDA,
                              "CUDA: the runtime %s has no %s: a CUDA runtime too old or not "
                              "libcudart (need CUDA 11.0 or newer)",
                              wh__cu_name, syms[i].name);
    }
    int v = 0;
    if (api.RuntimeGetVersion(&v) != WH__CUDA_SUCCESS || v < WH__CUDA_MIN_VERSION)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: the runtime %s is version %d.%d, too old (need 11.0 or newer)",
                          wh__cu_name, v / 1000, (v % 1000) / 10);
    /* the library stays loaded for the life of the process: deleters may
     * run at any time */
    wh__cu = api;
    wh__cu_version = v;
    wh__cu_loaded = true;
    wh__cu_pid = getpid();
    return true;
}

bool wh_cuda_init(int device, wh_err_t *err) {
    pthread_mutex_lock(&wh__cu_mu);
    bool ok = wh__cu_loaded || wh__load(err);
    pthread_mutex_unlock(&wh__cu_mu);
    if (!ok) return false;
    if (getpid() != wh__cu_pid)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: this process was forked after CUDA was initialised in its "
                          "parent; CUDA cannot be used here (DataLoader workers must not "
                          "create CUDA state: move batches to the GPU in the main process)");
    if (device < 0) return wh_err_set(err, WH_E_CUDA, "CUDA: device %d is not a device number", device);
    int drv = 0, n = 0;
    wh__cu.DriverGetVersion(&drv);
    if (drv == 0)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: no NVIDIA driver is installed (the runtime %s reports none)",
                          wh__cu_name);
    int rc = wh__cu.GetDeviceCount(&n);
    if (rc == WH__CUDA_ERR_INSUFFICIENT_DRIVER)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: the NVIDIA driver (CUDA %d.%d) is older than the runtime %s "
                          "(CUDA %d.%d): %s",
                          drv / 1000, (drv % 1000) / 10, wh__cu_name, wh__cu_version / 1000,
                          (wh__cu_version % 1000) / 10, wh__cu_str(rc));
    if (rc == WH__CUDA_ERR_NO_DEVICE) n = 0;
    else if (rc != WH__CUDA_SUCCESS) return wh__cu_fail(err, rc, "cudaGetDeviceCount");
    if (device >= n)
        return wh_err_set(err, WH_E_CUDA, "CUDA: no device %d: this machine has %d CUDA device%s",
                          device, n, n == 1 ? "" : "s");
    return true;
}

const char *wh_cuda_lib_name(void) { return wh__cu_loaded ? wh__cu_name : NULL; }
int wh_cuda_runtime_version(void) { return wh__cu_loaded ? wh__cu_version : 0; }

/* Runs CUDA calls for `device` on this thread, then gives the thread's
 * current device back (deleters run on the user's threads). */
static int wh__dev_enter(int device) {
    int prev = -1;
    if (wh__cu.GetDevice(&prev) != WH__CUDA_SUCCESS) prev = -1;
    if (prev != device) wh__cu.SetDevice(device);
    return prev;
}
static void wh__dev_leave(int device, int prev) {
    if (prev >= 0 && prev != device) wh__cu.SetDevice(prev);
}

void *wh_cuda_host_alloc(void *ctx, size_t size) {
    int dev = (int)(intptr_t)ctx, prev = wh__dev_enter(dev);
    void *p = NULL;
    if (wh__cu.HostAlloc(&p, size ? size : 1, WH__CUDA_HOST_ALLOC_PORTABLE) != WH__CUDA_SUCCESS)
        p = NULL;
    wh__dev_leave(dev, prev);
    return p;
}

void wh_cuda_host_free(void *ctx, void *p, size_t size) {
    (void)ctx;
    (void)size;
    if (p) wh__cu.FreeHost(p);
}

/* ---- the GPU stage ---- */

enum { WH__MAX_CONSUMERS = 8 };

/* What the pools' buffers share: a buffer whose last reference returns it
 * to its stage's pool. */
typedef struct {
    wh_buf_t buf; /* first member: the release callback casts back */
    struct wh_gpu *g;
    size_t cap;
    bool busy;
} wh__gbuf_t;

typedef struct wh__dbuf {
    wh__gbuf_t p; /* first member */
    wh__cevent_t start_ev, copy_ev; /* around the copy into this buffer */
    int ncons;                      /* consumers' release events, one per stream */
    intptr_t cons_stream[WH__MAX_CONSUMERS];
    wh__cevent_t cons_ev[WH__MAX_CONSUMERS];
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

struct wh_gpu {
    uint64_t refs; /* 1 for the owner, 1 per busy buffer */
    int device;
    pthread_mutex_t mu;
    wh__cstream_t stream;
    wh__dbuf_t *dbufs;
    wh__hbuf_t *hbufs;
    wh__inflight_t *inflight; /* FIFO in issue order (one stream: completes in order) */
    size_t ninflight, capinflight;
    wh_gpu_stats_t stats;
};

static void wh__gpu_free(wh_gpu_t *g) {
    int prev = wh__dev_enter(g->device);
    if (g->stream) {
        wh__cu.StreamSynchronize(g->stream);
        wh__cu.StreamDestroy(g->stream);
    }
    for (wh__dbuf_t *d = g->dbufs, *n; d; d = n) {
        n = d->next;
        /* a consumer's last work may still be queued */
        for (int i = 0; i < d->ncons; i++) {
            wh__cu.EventSynchronize(d->cons_ev[i]);
            wh__cu.EventDestroy(d->cons_ev[i]);
        }
        if (d->start_ev) wh__cu.EventDestroy(d->start_ev);
        if (d->copy_ev) wh__cu.EventDestroy(d->copy_ev);
        if (d->p.buf.data) wh__cu.Free(d->p.buf.data);
        free(d);
    }
    for (wh__hbuf_t *h = g->hbufs, *n; h; h = n) {
        n = h->next;
        wh__cu.FreeHost(h->p.buf.data);
        free(h);
    }
    wh__dev_leave(g->device, prev);
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
    int prev = wh__dev_enter(device);
    int rc = wh__cu.StreamCreateWithFlags(&g->stream, WH__CUDA_STREAM_NON_BLOCKING);
    wh__dev_leave(device, prev);
    if (rc != WH__CUDA_SUCCESS) {
        wh__cu_fail(err, rc, "cudaStreamCreateWithFlags");
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
        int prev = wh__dev_enter(g->device);
        wh__cu.StreamSynchronize(g->stream); /* host slots go back only after their copies */
        wh__dev_leave(g->device, prev);
    }
    for (size_t i = 0; i < n; i++) {
        wh_buf_unref(fl[i].host);
        wh_buf_unref(&fl[i].dev->p.buf);
    }
    free(fl);
    wh__gpu_unref(g);
}

/* Retires completed copies in order; mutex held, device entered. */
static void wh__poll_locked(wh_gpu_t *g, wh_buf_t **drop, size_t *ndrop) {
    size_t k = 0;
    while (k < g->ninflight && wh__cu.EventQuery(g->inflight[k].dev->copy_ev) == WH__CUDA_SUCCESS) {
        float ms = 0;
        if (wh__cu.EventElapsedTime(&ms, g->inflight[k].dev->start_ev,
                                    g->inflight[k].dev->copy_ev) == WH__CUDA_SUCCESS && ms > 0)
            g->stats.copy_ns += (uint64_t)(ms * 1e6);
        drop[(*ndrop)++] = g->inflight[k].host;
        drop[(*ndrop)++] = &g->inflight[k].dev->p.buf;
        k++;
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
        int prev = wh__dev_enter(g->device);
        wh__poll_locked(g, drop, &n);
        wh__dev_leave(g->device, prev);
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
            return wh_err_set(err, WH_E_CUDA, "CUDA: cannot allocate %zu bytes of page-locked "
                                              "host memory (cudaHostAlloc)", size), NULL;
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
        if (!x->p.busy && x->p.cap >= size && x->p.cap <= 2 * size + 4096 && (!d || x->p.cap < d->p.cap))
            d = x;
    if (!d) {
        d = calloc(1, sizeof *d);
        if (!d) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
        int rc = wh__cu.Malloc(&d->p.buf.data, WH_ALIGN_UP(size ? size : 1));
        if (rc == WH__CUDA_SUCCESS) rc = wh__cu.EventCreateWithFlags(&d->start_ev, WH__CUDA_EVENT_DEFAULT);
        if (rc == WH__CUDA_SUCCESS) rc = wh__cu.EventCreateWithFlags(&d->copy_ev, WH__CUDA_EVENT_DEFAULT);
        if (rc != WH__CUDA_SUCCESS) {
            if (d->start_ev) wh__cu.EventDestroy(d->start_ev);
            if (d->p.buf.data) wh__cu.Free(d->p.buf.data);
            free(d);
            wh_err_set(err, WH_E_CUDA, "CUDA: cannot allocate a %zu-byte device buffer on "
                                       "device %d: %s", size, g->device, wh__cu_str(rc));
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

wh_buf_t *wh_gpu_copy(wh_gpu_t *g, wh_buf_t *host, size_t size, wh_err_t *err) {
    if (size > host->size)
        return wh_err_set(err, WH_E_INVALID, "copy of %zu bytes from a %zu-byte buffer", size,
                          host->size), NULL;
    wh_gpu_poll(g);
    pthread_mutex_lock(&g->mu);
    int prev = wh__dev_enter(g->device);
    wh__dbuf_t *d = NULL;
    bool ok = true;
    if (g->ninflight == g->capinflight) {
        size_t nc = g->capinflight ? 2 * g->capinflight : 8;
        wh__inflight_t *ni = realloc(g->inflight, nc * sizeof *ni);
        if (!ni) ok = wh_err_set(err, WH_E_SYS, "out of memory");
        else {
            g->inflight = ni;
            g->capinflight = nc;
        }
    }
    if (ok) d = wh__dbuf_take(g, size, err);
    if (d) {
        /* the buffer's previous consumers must be done before it is overwritten */
        int rc = WH__CUDA_SUCCESS;
        for (int i = 0; i < d->ncons && rc == WH__CUDA_SUCCESS; i++)
            rc = wh__cu.StreamWaitEvent(g->stream, d->cons_ev[i], 0);
        if (rc == WH__CUDA_SUCCESS) rc = wh__cu.EventRecord(d->start_ev, g->stream);
        if (rc == WH__CUDA_SUCCESS)
            rc = wh__cu.MemcpyAsync(d->p.buf.data, host->data, size, WH__CUDA_MEMCPY_H2D, g->stream);
        if (rc == WH__CUDA_SUCCESS) rc = wh__cu.EventRecord(d->copy_ev, g->stream);
        if (rc != WH__CUDA_SUCCESS) {
            ok = wh__cu_fail(err, rc, "the host-to-device copy (cudaMemcpyAsync)");
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
        g->stats.copies++;
        g->stats.h2d_bytes += size;
    }
    wh__dev_leave(g->device, prev);
    pthread_mutex_unlock(&g->mu);
    return d ? &d->p.buf : NULL;
}

void wh_gpu_stats(wh_gpu_t *g, wh_gpu_stats_t *out) {
    wh_gpu_poll(g);
    pthread_mutex_lock(&g->mu);
    *out = g->stats;
    pthread_mutex_unlock(&g->mu);
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
    int prev = wh__dev_enter(g->device);
    int rc = wh__cu.StreamWaitEvent((wh__cstream_t)stream, d->copy_ev, 0);
    wh__dev_leave(g->device, prev);
    if (rc != WH__CUDA_SUCCESS) return wh__cu_fail(err, rc, "cudaStreamWaitEvent on the consumer's stream");
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
    int prev = wh__dev_enter(g->device);
    int i = 0;
    while (i < d->ncons && d->cons_stream[i] != stream) i++;
    if (i == d->ncons && i == WH__MAX_CONSUMERS) {
        /* too many streams to track: wait for the oldest on the host instead */
        uint64_t t0 = wh_now_mono_ns();
        wh__cu.EventSynchronize(d->cons_ev[0]);
        g->stats.host_wait_ns += wh_now_mono_ns() - t0;
        wh__cu.EventDestroy(d->cons_ev[0]);
        memmove(d->cons_ev, d->cons_ev + 1, (WH__MAX_CONSUMERS - 1) * sizeof *d->cons_ev);
        memmove(d->cons_stream, d->cons_stream + 1, (WH__MAX_CONSUMERS - 1) * sizeof *d->cons_stream);
        i = --d->ncons;
        g->stats.host_waits++;
    }
    if (i == d->ncons) {
        if (wh__cu.EventCreateWithFlags(&d->cons_ev[i], 2 /* cudaEventDisableTiming */) ==
            WH__CUDA_SUCCESS) {
            d->cons_stream[i] = stream;
            d->ncons++;
        } else {
            wh__cu.StreamSynchronize((wh__cstream_t)stream); /* no event: order on the host */
            i = -1;
        }
    }
    /* re-recording on the same stream supersedes the earlier release */
    if (i >= 0 && wh__cu.EventRecord(d->cons_ev[i], (wh__cstream_t)stream) != WH__CUDA_SUCCESS)
        wh__cu.StreamSynchronize((wh__cstream_t)stream);
    wh__dev_leave(g->device, prev);
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
        const char *flags = (const char *)b.buf->data + b.pad_off;
        for (uint32_t i = 0; i < b.n; i++) pad |= flags[i] != 0;
        wh_buf_t *dev = wh_gpu_copy(f->g, b.buf, b.buf->size, err);
        wh_buf_unref(b.buf); /* the stage holds it until the copy's event */
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
