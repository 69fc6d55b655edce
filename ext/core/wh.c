/* What wh.h declares: errors, dtypes, clocks, process-wide counters and the
 * sample buffer pool. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "wh.h"

bool wh_err_set(wh_err_t *err, wh_code_t code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return false;
}

bool wh_err_prefix(wh_err_t *err, const char *fmt, ...) {
    if (err) {
        char old[WH_ERR_LEN];
        va_list ap;
        memcpy(old, err->message, sizeof old);
        va_start(ap, fmt);
        int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n + 2 < sizeof err->message) {
            size_t k = (size_t)n;
            memcpy(err->message + k, ": ", 2);
            k += 2;
            size_t room = sizeof err->message - k - 1;
            size_t len = strnlen(old, room);
            memcpy(err->message + k, old, len);
            err->message[k + len] = '\0';
        }
    }
    return false;
}

bool wh_swap_cap_check(uint64_t n, const char *what, wh_err_t *err) {
    if (n < WH_SWAP_CAP_MIN || n > WH_SWAP_CAP_MAX)
        return wh_err_set(err, WH_E_INVALID, "%s must be between %u and 2**30 (%u), got %llu", what,
                          WH_SWAP_CAP_MIN, WH_SWAP_CAP_MAX, (unsigned long long)n);
    return true;
}

void wh_err_clear(wh_err_t *err) {
    if (err) {
        err->code = WH_OK;
        err->message[0] = '\0';
    }
}

static const struct {
    const char *name;
    size_t size;
} wh__dtypes[WH_DT_MAX_] = {
    [WH_DT_BOOL] = {"bool", 1},        [WH_DT_U8] = {"uint8", 1},
    [WH_DT_U16] = {"uint16", 2},       [WH_DT_U32] = {"uint32", 4},
    [WH_DT_U64] = {"uint64", 8},       [WH_DT_I8] = {"int8", 1},
    [WH_DT_I16] = {"int16", 2},        [WH_DT_I32] = {"int32", 4},
    [WH_DT_I64] = {"int64", 8},        [WH_DT_F16] = {"float16", 2},
    [WH_DT_F32] = {"float32", 4},      [WH_DT_F64] = {"float64", 8},
    [WH_DT_BF16] = {"bfloat16", 2},    [WH_DT_C64] = {"complex64", 8},
    [WH_DT_C128] = {"complex128", 16},
};

size_t wh_dtype_size(int dtype) {
    return (dtype > 0 && dtype < WH_DT_MAX_) ? wh__dtypes[dtype].size : 0;
}

const char *wh_dtype_name(int dtype) {
    return (dtype > 0 && dtype < WH_DT_MAX_) ? wh__dtypes[dtype].name : "?";
}

static wh_counters_t wh__counters;

void wh_counters_get(wh_counters_t *out) {
    out->bytes_copied_out = __atomic_load_n(&wh__counters.bytes_copied_out, __ATOMIC_RELAXED);
    out->bytes_copied_in = __atomic_load_n(&wh__counters.bytes_copied_in, __ATOMIC_RELAXED);
    out->copies_out = __atomic_load_n(&wh__counters.copies_out, __ATOMIC_RELAXED);
}

void wh_counters_reset(void) {
    __atomic_store_n(&wh__counters.bytes_copied_out, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wh__counters.bytes_copied_in, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wh__counters.copies_out, 0, __ATOMIC_RELAXED);
}

void wh_count_out(uint64_t nbytes) {
    __atomic_fetch_add(&wh__counters.bytes_copied_out, nbytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&wh__counters.copies_out, 1, __ATOMIC_RELAXED);
}

void wh_count_in(uint64_t nbytes) {
    __atomic_fetch_add(&wh__counters.bytes_copied_in, nbytes, __ATOMIC_RELAXED);
}

static uint64_t wh__clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t wh_now_real_ns(void) { return wh__clock_ns(CLOCK_REALTIME); }
uint64_t wh_now_mono_ns(void) { return wh__clock_ns(CLOCK_MONOTONIC); }

void wh_sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ---- reused sample buffers ----
 * Memory never touched costs a page fault per 4 KiB on first write (about
 * 16k faults for a 64 MiB sample), which dominates a read into fresh
 * memory. Buffers of WH__POOL_MIN bytes or more therefore come from a
 * process-wide pool: mapped once (transparent huge pages asked for), handed
 * back by the last reference (a DLPack deleter, from any thread) and reused
 * for the next read of a similar size. The pool keeps at most
 * WIREHEAD_POOL_BYTES (default 1 GiB) of idle buffers. */
#define WH__POOL_MIN (256u << 10)
#define WH__HUGE (2u << 20)

typedef struct wh__pooled {
    wh_buf_t buf;            /* first member: the release callback casts back */
    size_t cap;              /* bytes mapped */
    struct wh__pooled *next; /* while idle */
} wh__pooled_t;

static pthread_mutex_t wh__pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t wh__pool_once = PTHREAD_ONCE_INIT;
static wh__pooled_t *wh__pool_free;             /* idle buffers, most recently used first */
static size_t wh__pool_idle;                    /* bytes idle in the pool */
static size_t wh__pool_keep;                    /* most bytes kept idle */
static uint64_t wh__pool_hits, wh__pool_misses; /* atomic */

/* A child must not wait on a lock a parent thread held across fork. */
static void wh__pool_atfork_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    wh__pool_mu = fresh;
}

/* WIREHEAD_POOL_BYTES: decimal digits only (strtoull would take "-1" as
 * the largest count, an unlimited pool); anything else keeps the default and
 * says so once on stderr, as there is no caller to return an error to. */
static size_t wh__pool_env(void) {
    const size_t dflt = (size_t)1 << 30, most = (size_t)1 << 48;
    const char *e = getenv("WIREHEAD_POOL_BYTES");
    if (!e) return dflt;
    size_t v = 0, n = 0;
    bool ok = *e != '\0';
    for (const char *p = e; ok && *p; p++, n++)
        ok = *p >= '0' && *p <= '9' && n < 20 && (v = v * 10 + (size_t)(*p - '0')) <= most;
    if (ok) return v;
    fprintf(stderr,
            "wirehead: WIREHEAD_POOL_BYTES=%.40s is not a byte count in 0..%zu "
            "(decimal digits); using the default %zu bytes\n",
            e, most, dflt);
    return dflt;
}

static void wh__pool_init(void) {
    wh__pool_keep = wh__pool_env();
    pthread_atfork(NULL, NULL, wh__pool_atfork_child);
}

static void wh__pool_put(wh_buf_t *b);

static void wh__pool_unmap(wh__pooled_t *p) {
    munmap(p->buf.data, p->cap);
    free(p);
}

static wh_buf_t *wh__pool_take(size_t size) {
    pthread_once(&wh__pool_once, wh__pool_init);
    size_t unit = size >= WH__HUGE ? WH__HUGE : 4096;
    size_t cap = (size + unit - 1) / unit * unit;
    wh__pooled_t *got = NULL, **best = NULL;
    pthread_mutex_lock(&wh__pool_mu);
    /* the smallest idle buffer that holds size without wasting half of it */
    for (wh__pooled_t **pp = &wh__pool_free; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= cap && (*pp)->cap <= 2 * cap && (!best || (*pp)->cap < (*best)->cap))
            best = pp;
    if (best) {
        got = *best;
        *best = got->next;
        wh__pool_idle -= got->cap;
    }
    pthread_mutex_unlock(&wh__pool_mu);
    if (got) {
        __atomic_fetch_add(&wh__pool_hits, 1, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_add(&wh__pool_misses, 1, __ATOMIC_RELAXED);
        got = calloc(1, sizeof *got);
        if (!got) return NULL;
        void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            free(got);
            return NULL;
        }
        if (cap >= WH__HUGE) madvise(p, cap, MADV_HUGEPAGE); /* advice only: may be refused */
        got->buf.data = p;
        got->buf.release = wh__pool_put;
        got->buf.device_type = 1; /* kDLCPU */
        got->cap = cap;
    }
    got->next = NULL;
    got->buf.refs = 1;
    got->buf.size = size;
    return &got->buf;
}

/* The last reference is gone: keep the buffer for the next read, dropping
 * the least recently used idle ones beyond the pool's limit. */
static void wh__pool_put(wh_buf_t *b) {
    wh__pooled_t *p = (wh__pooled_t *)b, *drop = NULL;
    pthread_mutex_lock(&wh__pool_mu);
    if (p->cap <= wh__pool_keep) {
        p->next = wh__pool_free;
        wh__pool_free = p;
        p = NULL;
        size_t kept = 0;
        for (wh__pooled_t **pp = &wh__pool_free; *pp; pp = &(*pp)->next) {
            if (kept + (*pp)->cap > wh__pool_keep) {
                drop = *pp;
                *pp = NULL;
                break;
            }
            kept += (*pp)->cap;
        }
        wh__pool_idle = kept;
    }
    pthread_mutex_unlock(&wh__pool_mu);
    if (p) wh__pool_unmap(p);
    while (drop) {
        wh__pooled_t *next = drop->next;
        wh__pool_unmap(drop);
        drop = next;
    }
}

void wh_pool_stats(uint64_t *hits, uint64_t *misses, uint64_t *idle_bytes) {
    pthread_once(&wh__pool_once, wh__pool_init);
    *hits = __atomic_load_n(&wh__pool_hits, __ATOMIC_RELAXED);
    *misses = __atomic_load_n(&wh__pool_misses, __ATOMIC_RELAXED);
    pthread_mutex_lock(&wh__pool_mu);
    *idle_bytes = wh__pool_idle;
    pthread_mutex_unlock(&wh__pool_mu);
}

wh_buf_t *wh_buf_new(size_t size) {
    if (size > SIZE_MAX - WH__HUGE) return NULL;
    if (size >= WH__POOL_MIN) return wh__pool_take(size);
    wh_buf_t *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->data = aligned_alloc(WH_ALIGN, WH_ALIGN_UP(size ? size : 1));
    if (!b->data) {
        free(b);
        return NULL;
    }
    b->size = size;
    b->refs = 1;
    b->device_type = 1; /* kDLCPU */
    return b;
}

void wh_buf_ref(wh_buf_t *b) { __atomic_fetch_add(&b->refs, 1, __ATOMIC_RELAXED); }

void wh_buf_unref(wh_buf_t *b) {
    if (!b || __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (b->release) {
        b->release(b);
        return;
    }
    free(b->data);
    free(b);
}
