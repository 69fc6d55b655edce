/* The CUDA runtime, loaded at run time with dlopen: no CUDA headers or
 * libraries at build time, so one build serves CPU-only and GPU machines.
 * Only the functions and constants used are declared here, by hand, from
 * the CUDA runtime API reference; they have been stable since CUDA 4. */
#ifndef WH_CUDART_H
#define WH_CUDART_H

#include "wh.h"

typedef void *wh_cstream_t;
typedef void *wh_cevent_t;

enum {
    WH_CUDA_SUCCESS = 0,
    WH_CUDA_ERR_INSUFFICIENT_DRIVER = 35,
    WH_CUDA_ERR_NO_DEVICE = 100,
    WH_CUDA_ERR_NOT_READY = 600,
    WH_CUDA_MEMCPY_H2D = 1,
    WH_CUDA_STREAM_NON_BLOCKING = 1,
    WH_CUDA_EVENT_DEFAULT = 0,
    WH_CUDA_HOST_ALLOC_PORTABLE = 1,
    WH_CUDA_HOST_REGISTER_PORTABLE = 1,
    WH_CUDA_HOST_REGISTER_READ_ONLY = 8, /* CUDA 11.1+: read-only mappings */
    WH_CUDA_READ_ONLY_VERSION = 11010,
    WH_CUDA_MIN_VERSION = 11000, /* CUDA 11.0 */
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
    int (*MemcpyAsync)(void *, const void *, size_t, int, wh_cstream_t);
    int (*StreamCreateWithFlags)(wh_cstream_t *, unsigned);
    int (*StreamDestroy)(wh_cstream_t);
    int (*StreamSynchronize)(wh_cstream_t);
    int (*StreamWaitEvent)(wh_cstream_t, wh_cevent_t, unsigned);
    int (*EventCreateWithFlags)(wh_cevent_t *, unsigned);
    int (*EventDestroy)(wh_cevent_t);
    int (*EventRecord)(wh_cevent_t, wh_cstream_t);
    int (*EventQuery)(wh_cevent_t);
    int (*EventSynchronize)(wh_cevent_t);
    int (*EventElapsedTime)(float *, wh_cevent_t, wh_cevent_t);
    /* optional (NULL where the runtime lacks them): page-locking memory in place */
    int (*HostRegister)(void *, size_t, unsigned);
    int (*HostUnregister)(void *);
    int (*GetLastError)(void); /* optional too */
} wh_cudart_api_t;

/* The runtime's functions; filled by the first successful wh_cuda_init and
 * never changed after (the library stays loaded for the life of the
 * process: deleters may run at any time). */
extern wh_cudart_api_t wh_cudart;

/* Loads the runtime once per process (WIREHEAD_CUDA_LIB names a library;
 * otherwise a copy already in the process, e.g. torch's, then the usual
 * sonames) and checks that `device` exists. Errors (code WH_E_CUDA) name
 * what is missing: the library, a driver, device N, a new enough runtime. */
bool wh_cuda_init(int device, wh_err_t *err);
/* Path or soname of the loaded runtime and its version (e.g. 12040); NULL/0
 * before a successful wh_cuda_init. */
const char *wh_cuda_lib_name(void);
int wh_cuda_runtime_version(void);

/* The runtime's text for an error code, and an error naming the call. */
const char *wh_cudart_str(int rc);
bool wh_cudart_fail(wh_err_t *err, int rc, const char *what);
/* Runs CUDA calls for `device` on this thread (enter returns the thread's
 * previous device; leave gives it back: deleters run on users' threads). */
/* Clears the runtime's pending error of this thread after a failing call
 * whose error we handled: the runtime is torch's copy, and torch's check
 * after its next kernel launch would raise it against that kernel. */
void wh_cudart_clear(void);

int wh_cudart_enter(int device);
void wh_cudart_leave(int device, int prev);

/* Page-locked host memory (cudaHostAlloc) as a loader allocator hook;
 * ctx is the device number cast to a pointer. */
void *wh_cuda_host_alloc(void *ctx, size_t size);
void wh_cuda_host_free(void *ctx, void *p, size_t size);

#endif
