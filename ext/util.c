/* Errors, dtypes, clocks and process-wide counters. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    [WH_DT_BOOL] = {"bool", 1},     [WH_DT_U8] = {"uint8", 1},
    [WH_DT_U16] = {"uint16", 2},    [WH_DT_U32] = {"uint32", 4},
    [WH_DT_U64] = {"uint64", 8},    [WH_DT_I8] = {"int8", 1},
    [WH_DT_I16] = {"int16", 2},     [WH_DT_I32] = {"int32", 4},
    [WH_DT_I64] = {"int64", 8},     [WH_DT_F16] = {"float16", 2},
    [WH_DT_F32] = {"float32", 4},   [WH_DT_F64] = {"float64", 8},
    [WH_DT_BF16] = {"bfloat16", 2}, [WH_DT_C64] = {"complex64", 8},
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

wh_buf_t *wh_buf_new(size_t size) {
    if (size > SIZE_MAX - WH_ALIGN) return NULL;
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
