/* A fake CUDA runtime for the tests (built by tests/gpu/test_cuda.py with cc):
 * the subset of libcudart that ext/cuda/wh_cuda.c uses, on host memory. Every
 * stream is a queue run by its own thread, so "async" copies really happen
 * later (optionally slowed, or held until released), events complete when
 * their stream reaches them, and stream waits block only that stream. It
 * records violations a real GPU would turn into wrong bytes:
 *   - a host buffer changed between cudaMemcpyAsync and the copy running
 *     (a ring slot reused before its copy's event completed);
 *   - a read on one stream of device bytes whose copy on another stream has
 *     not completed (a consumer stream that did not wait on the copy event);
 *   - a copy overwriting device bytes that a read enqueued earlier on another
 *     stream has not done yet (device memory reused before its consumer);
 *   - cudaFree/cudaFreeHost/cudaHostUnregister of memory an unfinished
 *     operation uses;
 *   - a copy from registered memory (cudaHostRegister) that was unregistered
 *     before the copy ran (a DMA from memory no longer pinned).
 * Registered memory is read only when its copy runs, like a DMA engine.
 * Environment: FAKECUDA_DEVICES (1), FAKECUDA_RUNTIME_VERSION (12040),
 * FAKECUDA_DRIVER_VERSION (12040; 0 = no driver), FAKECUDA_COPY_DELAY_US (0),
 * FAKECUDA_REGISTER_LIMIT (bytes that may be registered at once, like
 * RLIMIT_MEMLOCK; unset: no limit), FAKECUDA_NO_REGISTER (1: the call is
 * not supported).
 * Test controls: the fake_* functions at the end (ctypes). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum {
    OK = 0,
    ERR_INVALID_VALUE = 1,
    ERR_NOMEM = 2,
    ERR_INSUFFICIENT_DRIVER = 35,
    ERR_NO_DEVICE = 100,
    ERR_INVALID_DEVICE = 101,
    ERR_INVALID_HANDLE = 400,
    ERR_NOT_READY = 600,
    ERR_ALREADY_REGISTERED = 712,
    ERR_HOST_NOT_REGISTERED = 713,
    ERR_NOT_SUPPORTED = 801
};

enum {
    OP_COPY,
    OP_RECORD,
    OP_WAIT,
    OP_READ,
    OP_GATE
};

struct fevent;
typedef struct fop {
    int kind;
    uint64_t id;
    char *dst;
    const char *src;
    size_t n;
    uint64_t sum;   /* checksum of a copy's source when enqueued */
    int registered; /* the source was registered memory when enqueued */
    int skip;       /* its source is gone: not copied */
    struct fevent *ev;
    uint64_t seq;
    int done;
    struct fop *next;
} fop_t;

typedef struct fstream {
    int id;
    pthread_t th;
    fop_t *head, *tail;
    fop_t *running;
    int stop;
    struct fstream *next_all;
} fstream_t;

typedef struct fevent {
    uint64_t recorded, done;
    double t_ms;
} fevent_t;

typedef struct region {
    char *p;
    size_t n;
    int device; /* 1: cudaMalloc, 0: cudaHostAlloc, 2: cudaHostRegister */
    unsigned flags;
    struct region *next;
} region_t;

static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t CV = PTHREAD_COND_INITIALIZER;
static fstream_t *all_streams, *legacy, *per_thread;
static region_t *regions;
static size_t registered_bytes;
static unsigned last_register_flags;
static long device_limit = -1; /* bytes cudaMalloc may hold; -1: no limit */
static size_t device_used;
static uint64_t next_op = 1, next_stream = 3;
static long delay_us = -1;
static int hold, gate;
static long counters[16];
enum {
    C_COPIES,
    C_PAGEABLE,
    C_WAITS,
    C_HOST_SYNCS,
    C_VIOLATIONS,
    C_RECORDS,
    C_READS,
    C_REGISTERS,
    C_UNREGISTERS,
    C_REGISTERED_COPIES
};
static const char *counter_names[] = {
    "copies",        "pageable_copies", "stream_waits", "host_syncs",  "violations",
    "event_records", "reads",           "registers",    "unregisters", "registered_copies"};
#define MAXV 64
static char violations[MAXV][256];
/* finished ops are kept (never freed while the fake lives) so fake_op_done
 * can answer for any id; tests issue few */
static fop_t *finished;
static __thread int cur_device;

static long env_long(const char *name, long dflt) {
    const char *s = getenv(name);
    return s && *s ? strtol(s, NULL, 10) : dflt;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t checksum(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h;
}

/* M held */
static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
    long k = counters[C_VIOLATIONS]++;
    if (k >= MAXV) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(violations[k], sizeof violations[k], fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakecuda: VIOLATION: %s\n", violations[k]);
}

static int overlap(const char *a, size_t an, const char *b, size_t bn) {
    return a < b + bn && b < a + an;
}

static region_t *find_region(const void *p) {
    for (region_t *r = regions; r; r = r->next)
        if ((const char *)p >= r->p && (const char *)p < r->p + r->n) return r;
    return NULL;
}

/* Every op not finished, in any stream (running or queued); M held. */
#define FOR_PENDING(s, o)                                                                          \
    for (fstream_t *s = all_streams; s; s = s->next_all)                                           \
        for (fop_t *o = s->running ? s->running : s->head; o;                                      \
             o = (o == s->running ? s->head : o->next))

/* Reports each unfinished op of `kind` on another stream, enqueued before op,
 * touching the device bytes [p, p + n); why: the message after the ids. */
static void races(fstream_t *me, fop_t *op, int kind, const char *p, size_t n, const char *why) {
    FOR_PENDING(s, o) {
        const char *q = kind == OP_READ ? o->src : o->dst;
        if (s != me && o->kind == kind && o->id < op->id && overlap(q, o->n, p, n))
            violation("%s #%llu on stream %d and %s #%llu on stream %d, enqueued earlier and not "
                      "done: %s",
                      op->kind == OP_COPY ? "copy" : "read", (unsigned long long)op->id, me->id,
                      kind == OP_COPY ? "copy" : "read", (unsigned long long)o->id, s->id, why);
    }
}

static void check_before(fstream_t *me, fop_t *op) {
    if (op->kind == OP_COPY) {
        region_t *r = op->registered ? find_region(op->src) : NULL;
        if (op->registered && (!r || r->device != 2 || op->src + op->n > r->p + r->n)) {
            violation("copy #%llu reads host memory %p that was unregistered before the copy "
                      "ran (a DMA from memory no longer pinned)",
                      (unsigned long long)op->id, (const void *)op->src);
            op->skip = 1; /* the bytes may be gone: not read */
            return;
        }
        if (checksum(op->src, op->n) != op->sum)
            violation("the host buffer %p of copy #%llu changed before the copy ran (a slot "
                      "reused before its copy event completed)",
                      (const void *)op->src, (unsigned long long)op->id);
        races(me, op, OP_READ, op->dst, op->n,
              "the copy overwrote device bytes before the read (device memory reused before "
              "its consumer finished)");
    } else if (op->kind == OP_READ) {
        races(me, op, OP_COPY, op->src, op->n,
              "the read saw device bytes before their copy completed (the consumer stream "
              "did not wait on the copy event)");
    }
}

static void *stream_main(void *arg) {
    fstream_t *s = arg;
    pthread_mutex_lock(&M);
    for (;;) {
        fop_t *op = s->head;
        if (!op) {
            if (s->stop) break;
            pthread_cond_wait(&CV, &M);
            continue;
        }
        if (op->kind == OP_WAIT && op->ev->done < op->seq) {
            pthread_cond_wait(&CV, &M);
            continue;
        }
        if ((op->kind == OP_COPY && hold) || (op->kind == OP_GATE && gate)) {
            pthread_cond_wait(&CV, &M);
            continue;
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        op->next = NULL;
        s->running = op;
        if (op->kind == OP_COPY || op->kind == OP_READ) check_before(s, op);
        long d = delay_us;
        pthread_mutex_unlock(&M);
        if (op->kind == OP_COPY) {
            if (d > 0) usleep((useconds_t)d);
            if (!op->skip) memcpy(op->dst, op->src, op->n);
        } else if (op->kind == OP_READ) {
            memcpy(op->dst, op->src, op->n);
        }
        pthread_mutex_lock(&M);
        if (op->kind == OP_RECORD && op->ev->done < op->seq) {
            op->ev->done = op->seq;
            op->ev->t_ms = now_ms();
        }
        op->done = 1;
        s->running = NULL;
        op->next = finished;
        finished = op;
        pthread_cond_broadcast(&CV);
    }
    pthread_mutex_unlock(&M);
    return NULL;
}

/* M held */
static fstream_t *new_stream(int id) {
    fstream_t *s = calloc(1, sizeof *s);
    s->id = id;
    s->next_all = all_streams;
    all_streams = s;
    pthread_create(&s->th, NULL, stream_main, s);
    return s;
}

/* 0 and 1: the legacy default stream; 2: the per-thread default stream. M held. */
static fstream_t *resolve(void *h) {
    if (delay_us < 0) delay_us = env_long("FAKECUDA_COPY_DELAY_US", 0);
    uintptr_t v = (uintptr_t)h;
    if (v == 0 || v == 1) return legacy ? legacy : (legacy = new_stream(1));
    if (v == 2) return per_thread ? per_thread : (per_thread = new_stream(2));
    for (fstream_t *s = all_streams; s; s = s->next_all)
        if (s == h) return s;
    return NULL;
}

/* M held */
static fop_t *enqueue(fstream_t *s, int kind) {
    fop_t *op = calloc(1, sizeof *op);
    op->kind = kind;
    op->id = next_op++;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&CV);
    return op;
}

/* Waits until s has nothing queued or running; M held. */
static void drain(fstream_t *s) {
    while (s->head || s->running) pthread_cond_wait(&CV, &M);
}

static int devices(void) { return (int)env_long("FAKECUDA_DEVICES", 1); }

API int cudaRuntimeGetVersion(int *v) {
    *v = (int)env_long("FAKECUDA_RUNTIME_VERSION", 12040);
    return OK;
}
API int cudaDriverGetVersion(int *v) {
    *v = (int)env_long("FAKECUDA_DRIVER_VERSION", 12040);
    return OK;
}
API int cudaGetDeviceCount(int *n) {
    *n = 0;
    if (env_long("FAKECUDA_DRIVER_VERSION", 12040) == 0) return ERR_INSUFFICIENT_DRIVER;
    if (devices() <= 0) return ERR_NO_DEVICE;
    *n = devices();
    return OK;
}
API int cudaGetDevice(int *d) {
    *d = cur_device;
    return OK;
}
API int cudaSetDevice(int d) {
    if (d < 0 || d >= devices()) return ERR_INVALID_DEVICE;
    cur_device = d;
    return OK;
}
API const char *cudaGetErrorString(int rc) {
    switch (rc) {
    case OK: return "no error";
    case ERR_INVALID_VALUE: return "invalid argument";
    case ERR_NOMEM: return "out of memory";
    case ERR_INSUFFICIENT_DRIVER:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case ERR_NO_DEVICE: return "no CUDA-capable device is detected";
    case ERR_INVALID_DEVICE: return "invalid device ordinal";
    case ERR_INVALID_HANDLE: return "invalid resource handle";
    case ERR_NOT_READY: return "device not ready";
    case ERR_ALREADY_REGISTERED:
        return "part or all of the requested memory range is already mapped";
    case ERR_HOST_NOT_REGISTERED:
        return "pointer does not correspond to a registered memory region";
    case ERR_NOT_SUPPORTED: return "operation not supported";
    default: return "unknown error";
    }
}

static int alloc_region(void **p, size_t n, int device) {
    size_t cap = (n + 255) / 256 * 256;
    char *m = aligned_alloc(256, cap ? cap : 256);
    if (!m) return ERR_NOMEM;
    memset(m, device ? 0xAB : 0xCD, cap); /* garbage: bytes never copied show */
    region_t *r = calloc(1, sizeof *r);
    r->p = m;
    r->n = n;
    r->device = device;
    pthread_mutex_lock(&M);
    r->next = regions;
    regions = r;
    pthread_mutex_unlock(&M);
    *p = m;
    return OK;
}

static int free_region(void *p, int device) {
    if (!p) return OK;
    pthread_mutex_lock(&M);
    region_t **rr = &regions;
    while (*rr && !((*rr)->p == p && (*rr)->device == device)) rr = &(*rr)->next;
    if (!*rr) {
        pthread_mutex_unlock(&M);
        return ERR_INVALID_VALUE;
    }
    region_t *r = *rr;
    FOR_PENDING(s, o) {
        if ((o->kind == OP_COPY &&
             (overlap(o->src, o->n, r->p, r->n) || overlap(o->dst, o->n, r->p, r->n))) ||
            (o->kind == OP_READ && overlap(o->src, o->n, r->p, r->n)))
            violation("%s of %p while operation #%llu on stream %d still uses it",
                      device ? "cudaFree" : "cudaFreeHost", p, (unsigned long long)o->id, s->id);
    }
    *rr = r->next;
    if (device == 1) device_used -= r->n;
    pthread_mutex_unlock(&M);
    free(r->p);
    free(r);
    return OK;
}

API int cudaMalloc(void **p, size_t n) {
    pthread_mutex_lock(&M);
    int full = device_limit >= 0 && device_used + n > (size_t)device_limit;
    if (!full) device_used += n;
    pthread_mutex_unlock(&M);
    if (full) return ERR_NOMEM;
    return alloc_region(p, n, 1);
}
API int cudaFree(void *p) { return free_region(p, 1); }
API int cudaHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    return alloc_region(p, n, 0);
}
API int cudaFreeHost(void *p) { return free_region(p, 0); }

/* The real runtime keeps a failing call's error pending per thread until
 * cudaGetLastError, and torch raises a pending one after its next kernel
 * launch: the fake keeps it too (for the calls a caller may handle). */
static __thread int last_err;
static int failed(int rc) { return last_err = rc; }
API int cudaGetLastError(void) {
    int rc = last_err;
    last_err = OK;
    return rc;
}
API int cudaPeekAtLastError(void) { return last_err; }

/* Page-locks caller memory in place: a region that is not the fake's to free. */
API int cudaHostRegister(void *p, size_t n, unsigned flags) {
    if (env_long("FAKECUDA_NO_REGISTER", 0)) return failed(ERR_NOT_SUPPORTED);
    long limit = env_long("FAKECUDA_REGISTER_LIMIT", -1);
    pthread_mutex_lock(&M);
    if (limit >= 0 && registered_bytes + n > (size_t)limit) {
        pthread_mutex_unlock(&M);
        return failed(ERR_NOMEM);
    }
    for (region_t *r = regions; r; r = r->next)
        if (r->device == 2 && overlap(r->p, r->n, p, n)) {
            pthread_mutex_unlock(&M);
            return failed(ERR_ALREADY_REGISTERED);
        }
    region_t *r = calloc(1, sizeof *r);
    r->p = p;
    r->n = n;
    r->device = 2;
    r->flags = flags;
    r->next = regions;
    regions = r;
    registered_bytes += n;
    last_register_flags = flags;
    counters[C_REGISTERS]++;
    pthread_mutex_unlock(&M);
    return OK;
}

API int cudaHostUnregister(void *p) {
    pthread_mutex_lock(&M);
    region_t **rr = &regions;
    while (*rr && !((*rr)->p == p && (*rr)->device == 2)) rr = &(*rr)->next;
    if (!*rr) {
        pthread_mutex_unlock(&M);
        return ERR_HOST_NOT_REGISTERED;
    }
    region_t *r = *rr;
    FOR_PENDING(s, o) {
        if (o->kind == OP_COPY && overlap(o->src, o->n, r->p, r->n))
            violation("cudaHostUnregister of %p while copy #%llu on stream %d still reads it", p,
                      (unsigned long long)o->id, s->id);
    }
    *rr = r->next;
    registered_bytes -= r->n;
    counters[C_UNREGISTERS]++;
    pthread_mutex_unlock(&M);
    free(r);
    return OK;
}

API int cudaStreamCreateWithFlags(void **out, unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&M);
    *out = new_stream((int)next_stream++);
    pthread_mutex_unlock(&M);
    return OK;
}

API int cudaStreamDestroy(void *h) {
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    if (!s || s == legacy || s == per_thread) {
        pthread_mutex_unlock(&M);
        return ERR_INVALID_HANDLE;
    }
    s->stop = 1; /* queued work still completes, as on a GPU */
    pthread_cond_broadcast(&CV);
    pthread_mutex_unlock(&M);
    pthread_join(s->th, NULL);
    pthread_mutex_lock(&M);
    for (fstream_t **pp = &all_streams; *pp; pp = &(*pp)->next_all)
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    pthread_mutex_unlock(&M);
    free(s);
    return OK;
}

API int cudaStreamSynchronize(void *h) {
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    if (s) {
        counters[C_HOST_SYNCS]++;
        drain(s);
    }
    pthread_mutex_unlock(&M);
    return s ? OK : ERR_INVALID_HANDLE;
}

API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *h) {
    if (kind != 1) return ERR_INVALID_VALUE; /* only host-to-device is used */
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    region_t *d = find_region(dst), *hs = find_region(src);
    if (!s || !d || !d->device || (char *)dst + n > d->p + d->n) {
        pthread_mutex_unlock(&M);
        return !s ? ERR_INVALID_HANDLE : ERR_INVALID_VALUE;
    }
    if (!hs || hs->device == 1) counters[C_PAGEABLE]++;
    if (hs && hs->device == 2) counters[C_REGISTERED_COPIES]++;
    counters[C_COPIES]++;
    fop_t *op = enqueue(s, OP_COPY);
    op->dst = dst;
    op->src = src;
    op->n = n;
    op->registered = hs && hs->device == 2;
    op->sum = checksum(src, n);
    pthread_mutex_unlock(&M);
    return OK;
}

API int cudaEventCreateWithFlags(void **ev, unsigned flags) {
    (void)flags;
    *ev = calloc(1, sizeof(fevent_t));
    return *ev ? OK : ERR_NOMEM;
}

API int cudaEventDestroy(void *ev) {
    free(ev); /* callers destroy only events they no longer wait on */
    return OK;
}

/* Locks M and resolves h; NULL (M unlocked) for a bad stream or event. */
static fstream_t *lock_stream(void *h, void *ev) {
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    if (!s || !ev) {
        pthread_mutex_unlock(&M);
        return NULL;
    }
    return s;
}

API int cudaEventRecord(void *ev, void *h) {
    fstream_t *s = lock_stream(h, ev);
    if (!s) return ERR_INVALID_HANDLE;
    fevent_t *e = ev;
    fop_t *op = enqueue(s, OP_RECORD);
    op->ev = e;
    op->seq = ++e->recorded;
    counters[C_RECORDS]++;
    pthread_mutex_unlock(&M);
    return OK;
}

API int cudaEventQuery(void *ev) {
    pthread_mutex_lock(&M);
    fevent_t *e = ev;
    int rc = e->done >= e->recorded ? OK : failed(ERR_NOT_READY);
    pthread_mutex_unlock(&M);
    return rc;
}

API int cudaEventSynchronize(void *ev) {
    pthread_mutex_lock(&M);
    fevent_t *e = ev;
    uint64_t want = e->recorded;
    counters[C_HOST_SYNCS]++;
    while (e->done < want) pthread_cond_wait(&CV, &M);
    pthread_mutex_unlock(&M);
    return OK;
}

API int cudaEventElapsedTime(float *ms, void *a, void *b) {
    pthread_mutex_lock(&M);
    fevent_t *x = a, *y = b;
    int rc = x->done >= x->recorded && y->done >= y->recorded && x->recorded && y->recorded
                 ? OK
                 : ERR_NOT_READY;
    if (rc == OK) *ms = (float)(y->t_ms - x->t_ms);
    pthread_mutex_unlock(&M);
    return rc;
}

/* Waits on the event's record as of now; an event never recorded is a no-op. */
API int cudaStreamWaitEvent(void *h, void *ev, unsigned flags) {
    (void)flags;
    fstream_t *s = lock_stream(h, ev);
    if (!s) return ERR_INVALID_HANDLE;
    fevent_t *e = ev;
    counters[C_WAITS]++;
    if (e->recorded) {
        fop_t *op = enqueue(s, OP_WAIT);
        op->ev = e;
        op->seq = e->recorded;
    }
    pthread_mutex_unlock(&M);
    return OK;
}

/* ---- test controls ---- */

/* A consumer kernel reading device bytes on a stream: n bytes at src go to
 * out when the stream gets there. Returns the op id for fake_op_done. */
API unsigned long long fake_stream_read(void *h, const void *src, size_t n, void *out) {
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    if (!s) {
        pthread_mutex_unlock(&M);
        return 0;
    }
    fop_t *op = enqueue(s, OP_READ);
    op->src = src;
    op->dst = out;
    op->n = n;
    counters[C_READS]++;
    unsigned long long id = op->id;
    pthread_mutex_unlock(&M);
    return id;
}

API int fake_op_done(unsigned long long id) {
    pthread_mutex_lock(&M);
    int done = 0;
    for (fop_t *o = finished; o && !done; o = o->next) done = o->id == id;
    pthread_mutex_unlock(&M);
    return done;
}

/* Waits for a stream (0/1/2 or a handle) without counting a host sync. */
API void fake_drain(void *h) {
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    if (s) drain(s);
    pthread_mutex_unlock(&M);
}

/* Waits for every stream. */
API void fake_drain_all(void) {
    pthread_mutex_lock(&M);
    for (;;) {
        int busy = 0;
        for (fstream_t *s = all_streams; s; s = s->next_all) busy |= s->head || s->running;
        if (!busy) break;
        pthread_cond_wait(&CV, &M);
    }
    pthread_mutex_unlock(&M);
}

/* Stops a stream where it is now (a long kernel) until fake_open_gate. */
API void fake_gate(void *h) {
    pthread_mutex_lock(&M);
    fstream_t *s = resolve(h);
    gate = 1;
    if (s) enqueue(s, OP_GATE);
    pthread_mutex_unlock(&M);
}

API void fake_open_gate(void) {
    pthread_mutex_lock(&M);
    gate = 0;
    pthread_cond_broadcast(&CV);
    pthread_mutex_unlock(&M);
}

/* Copies wait (on=1) until released (on=0): a copy engine as slow as a test needs. */
API void fake_hold_copies(int on) {
    pthread_mutex_lock(&M);
    hold = on;
    pthread_cond_broadcast(&CV);
    pthread_mutex_unlock(&M);
}

API void fake_set_copy_delay_us(long us) {
    pthread_mutex_lock(&M);
    delay_us = us;
    pthread_mutex_unlock(&M);
}

API long fake_counter(const char *name) {
    for (size_t i = 0; i < sizeof counter_names / sizeof *counter_names; i++)
        if (!strcmp(name, counter_names[i])) {
            pthread_mutex_lock(&M);
            long v = counters[i];
            pthread_mutex_unlock(&M);
            return v;
        }
    return -1;
}

API int fake_violation(int i, char *out, int cap) {
    pthread_mutex_lock(&M);
    int ok = i >= 0 && i < MAXV && i < counters[C_VIOLATIONS];
    if (ok) snprintf(out, (size_t)cap, "%s", violations[i]);
    pthread_mutex_unlock(&M);
    return ok;
}

API void fake_reset(void) {
    pthread_mutex_lock(&M);
    memset(counters, 0, sizeof counters);
    pthread_mutex_unlock(&M);
}

/* 1: device memory from cudaMalloc, 0: page-locked host memory, -1: neither. */
API int fake_kind(const void *p) {
    pthread_mutex_lock(&M);
    region_t *r = find_region(p);
    int k = r ? r->device : -1;
    pthread_mutex_unlock(&M);
    return k;
}

/* Device memory cudaMalloc may hold from now on (-1: no limit). */
API void fake_set_device_limit(long bytes) {
    pthread_mutex_lock(&M);
    device_limit = bytes;
    pthread_mutex_unlock(&M);
}

/* The flags of the last successful cudaHostRegister. */
API unsigned fake_last_register_flags(void) {
    pthread_mutex_lock(&M);
    unsigned f = last_register_flags;
    pthread_mutex_unlock(&M);
    return f;
}

/* Bytes registered now. */
API unsigned long long fake_registered_bytes(void) {
    pthread_mutex_lock(&M);
    unsigned long long n = registered_bytes;
    pthread_mutex_unlock(&M);
    return n;
}
