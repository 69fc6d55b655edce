/* wirehead_torch C core: shared types, the error struct and WH_ macros.
 * Plain C; no Python here. */
#ifndef WH_H
#define WH_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* 2: a sample's header records its generation and position */
#define WH_FORMAT_VERSION 2
#define WH_MAX_FIELDS 16
#define WH_MAX_NDIM 8
#define WH_MAX_NAME 64
#define WH_ERR_LEN 512

/* SWAP_CAP, positions per generation: the one range every C guard checks
 * (config.py reads it as _C.SWAP_CAP_MAX). 2**30 keeps positions, and
 * their sums over a segment's areas, well inside uint32. */
#define WH_SWAP_CAP_MIN 1u
#define WH_SWAP_CAP_MAX (1u << 30)
/* BYTE_BUDGET, bytes per generation area: 0 is auto (a put sizes the shm
 * store from its sample); a set one is at least the store's least area. */
#define WH_BYTE_BUDGET_AUTO 0u
#define WH_BYTE_BUDGET_MIN 4096u

/* Error codes; the module glue maps each to a Python exception class. */
typedef enum {
    WH_OK = 0,
    WH_E_INVALID,  /* bad argument or bad sample from the caller */
    WH_E_SCHEMA,   /* store made with another format/SAMPLE/SWAP_CAP */
    WH_E_GONE,     /* generation reclaimed while reading: move to newest */
    WH_E_CORRUPT,  /* stored bytes fail validation or checksum: skip */
    WH_E_NOSPACE,  /* store cannot be created in the space available */
    WH_E_TOOBIG,   /* one sample larger than a generation's byte budget */
    WH_E_TIMEOUT,  /* bounded wait ran out */
    WH_E_UNAVAIL,  /* server unreachable / connection lost */
    WH_E_NOTFOUND, /* no such generation/position/store */
    WH_E_SYS,      /* OS call failed */
    WH_E_LEASE,    /* this manager does not hold the lease (lost or expired) */
    WH_E_PINNED,   /* a view would break the pin policy: read a copy instead */
    WH_E_INTERNAL,
    WH_E_CUDA,    /* CUDA runtime missing or failing (wh_cuda.c) */
    WH_E_NOSTORE, /* the store does not exist yet (shm, BYTE_BUDGET auto: the first
                       put creates it); a kind of NOTFOUND */
    WH_E_SPECFAIL /* spec mode: a sample index failed every attempt (docs/reproducible.md) */
} wh_code_t;

typedef struct {
    wh_code_t code;
    char message[WH_ERR_LEN];
} wh_err_t;

/* Fills err (if not NULL) and returns false, so callers can
 * `return wh_err_set(err, WH_E_X, "...", ...);` */
bool wh_err_set(wh_err_t *err, wh_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prepends context: "ctx: <old message>". Keeps the code. Returns false. */
bool wh_err_prefix(wh_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void wh_err_clear(wh_err_t *err);
/* The SWAP_CAP range check (WH_SWAP_CAP_MIN..MAX) every C guard calls:
 * false with err (WH_E_INVALID) naming what (the key, or the plan's field)
 * and the value. */
bool wh_swap_cap_check(uint64_t n, const char *what, wh_err_t *err);

/* Element types. Codes are stored on disk/shm: never renumber. */
typedef enum {
    WH_DT_BOOL = 1,
    WH_DT_U8,
    WH_DT_U16,
    WH_DT_U32,
    WH_DT_U64,
    WH_DT_I8,
    WH_DT_I16,
    WH_DT_I32,
    WH_DT_I64,
    WH_DT_F16,
    WH_DT_F32,
    WH_DT_F64,
    WH_DT_BF16,
    WH_DT_C64,
    WH_DT_C128,
    WH_DT_MAX_
} wh_dtype_t;

/* Itemsize in bytes, 0 for an unknown code. */
size_t wh_dtype_size(int dtype);
/* Short name ("float32"), "?" for an unknown code. */
const char *wh_dtype_name(int dtype);

/* A caller's array: any strides (in bytes, may be negative), 0-d allowed.
 * data points at element [0,...,0]. Not owned. */
typedef struct {
    int dtype;
    int ndim;
    int64_t shape[WH_MAX_NDIM];
    int64_t strides[WH_MAX_NDIM];
    const void *data;
} wh_array_t;

/* Checked size arithmetic: false on overflow. */
static inline bool wh_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool wh_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#define WH_ALIGN 64
#define WH_ALIGN_UP(x) (((x) + (WH_ALIGN - 1)) & ~(uint64_t)(WH_ALIGN - 1))
#define WH_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define WH_UNUSED(x) ((void)(x))

/* Process-wide counters (atomics) that tests and benchmarks read. */
typedef struct {
    uint64_t bytes_copied_out; /* bytes copied from a store into a caller buffer */
    uint64_t bytes_copied_in;  /* bytes copied from caller arrays into a store */
    uint64_t copies_out;       /* number of such copies (one per field read) */
} wh_counters_t;
void wh_counters_get(wh_counters_t *out);
void wh_counters_reset(void);
void wh_count_out(uint64_t nbytes);
void wh_count_in(uint64_t nbytes);

/* A reference-counted byte buffer that DLPack exports share. release(buf)
 * runs when the last reference goes, from whatever thread drops it (no GIL
 * assumed); without release the buffer frees itself. */
typedef struct wh_buf wh_buf_t;
struct wh_buf {
    uint64_t refs; /* atomic */
    void *data;
    size_t size;
    int device_type; /* DLPack device type: 1 CPU, 2 CUDA, 3 CUDA host */
    int device_id;
    void (*release)(wh_buf_t *buf);
    void *owner; /* for release */
};

/* New heap buffer of size bytes (64-byte aligned), refs = 1; NULL on OOM.
 * Owned by the caller's reference. */
wh_buf_t *wh_buf_new(size_t size);
/* Buffers of 256 KiB or more come from a process-wide pool of reused,
 * already-faulted mappings (huge pages advised); the last unref returns
 * them. hits/misses count takes served from the pool or freshly mapped. */
void wh_pool_stats(uint64_t *hits, uint64_t *misses, uint64_t *idle_bytes);
void wh_buf_ref(wh_buf_t *b);
void wh_buf_unref(wh_buf_t *b);

/* Wall clock in ns (CLOCK_REALTIME) and monotonic in ns. */
uint64_t wh_now_real_ns(void);
uint64_t wh_now_mono_ns(void);
/* Sleep for ms milliseconds (used only by bounded polling waits). */
void wh_sleep_ms(unsigned ms);

#endif
