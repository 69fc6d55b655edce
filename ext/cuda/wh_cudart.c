/* The CUDA runtime through dlopen (see wh_cudart.h). */
#define _GNU_SOURCE
#include "wh_cudart.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

wh_cudart_api_t wh_cudart;
static pthread_mutex_t wh__cu_mu = PTHREAD_MUTEX_INITIALIZER;
static bool wh__cu_loaded;
static char wh__cu_name[256];
static int wh__cu_version;
static pid_t wh__cu_pid; /* CUDA state does not survive fork */

const char *wh_cudart_str(int rc) {
    const char *s = wh_cudart.GetErrorString ? wh_cudart.GetErrorString(rc) : NULL;
    return s ? s : "unknown CUDA error";
}

bool wh_cudart_fail(wh_err_t *err, int rc, const char *what) {
    return wh_err_set(err, WH_E_CUDA, "CUDA: %s failed: %s (error %d)", what, wh_cudart_str(rc),
                      rc);
}

static void *wh__open_lib(char *tried, size_t cap) {
    const char *env = getenv("WIREHEAD_CUDA_LIB");
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(tried, cap, "WIREHEAD_CUDA_LIB=%s cannot be loaded: %s", env, dlerror());
        else
            snprintf(wh__cu_name, sizeof wh__cu_name, "%s", env);
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
    wh_cudart_api_t api;
    struct {
        void **slot;
        const char *name;
    } syms[] = {
#define WH__SYM(f) {(void **)&api.f, "cuda" #f}
        WH__SYM(GetDeviceCount),   WH__SYM(GetDevice),
        WH__SYM(SetDevice),        WH__SYM(RuntimeGetVersion),
        WH__SYM(DriverGetVersion), WH__SYM(GetErrorString),
        WH__SYM(HostAlloc),        WH__SYM(FreeHost),
        WH__SYM(Malloc),           WH__SYM(Free),
        WH__SYM(MemcpyAsync),      WH__SYM(StreamCreateWithFlags),
        WH__SYM(StreamDestroy),    WH__SYM(StreamSynchronize),
        WH__SYM(StreamWaitEvent),  WH__SYM(EventCreateWithFlags),
        WH__SYM(EventDestroy),     WH__SYM(EventRecord),
        WH__SYM(EventQuery),       WH__SYM(EventSynchronize),
        WH__SYM(EventElapsedTime),
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
    /* optional: without them the loader stages batches in page-locked memory */
    api.HostRegister = (int (*)(void *, size_t, unsigned))dlsym(h, "cudaHostRegister");
    api.HostUnregister = (int (*)(void *))dlsym(h, "cudaHostUnregister");
    if (!api.HostUnregister) api.HostRegister = NULL;
    api.GetLastError = (int (*)(void))dlsym(h, "cudaGetLastError");
    int v = 0;
    if (api.RuntimeGetVersion(&v) != WH_CUDA_SUCCESS || v < WH_CUDA_MIN_VERSION)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: the runtime %s is version %d.%d, too old (need 11.0 or newer)",
                          wh__cu_name, v / 1000, (v % 1000) / 10);
    /* the library stays loaded for the life of the process: deleters may
     * run at any time */
    wh_cudart = api;
    wh__cu_version = v;
    wh__cu_loaded = true;
    wh__cu_pid = getpid();
    return true;
}

void wh_cudart_clear(void) {
    if (wh_cudart.GetLastError) wh_cudart.GetLastError();
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
    if (device < 0)
        return wh_err_set(err, WH_E_CUDA, "CUDA: device %d is not a device number", device);
    int drv = 0, n = 0;
    wh_cudart.DriverGetVersion(&drv);
    if (drv == 0)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: no NVIDIA driver is installed (the runtime %s reports none)",
                          wh__cu_name);
    int rc = wh_cudart.GetDeviceCount(&n);
    if (rc == WH_CUDA_ERR_INSUFFICIENT_DRIVER)
        return wh_err_set(err, WH_E_CUDA,
                          "CUDA: the NVIDIA driver (CUDA %d.%d) is older than the runtime %s "
                          "(CUDA %d.%d): %s",
                          drv / 1000, (drv % 1000) / 10, wh__cu_name, wh__cu_version / 1000,
                          (wh__cu_version % 1000) / 10, wh_cudart_str(rc));
    if (rc == WH_CUDA_ERR_NO_DEVICE)
        n = 0;
    else if (rc != WH_CUDA_SUCCESS)
        return wh_cudart_fail(err, rc, "cudaGetDeviceCount");
    if (device >= n)
        return wh_err_set(err, WH_E_CUDA, "CUDA: no device %d: this machine has %d CUDA device%s",
                          device, n, n == 1 ? "" : "s");
    return true;
}

const char *wh_cuda_lib_name(void) { return wh__cu_loaded ? wh__cu_name : NULL; }
int wh_cuda_runtime_version(void) { return wh__cu_loaded ? wh__cu_version : 0; }

/* Runs CUDA calls for `device` on this thread, then gives the thread's
 * current device back (deleters run on the user's threads). */
int wh_cudart_enter(int device) {
    int prev = -1;
    if (wh_cudart.GetDevice(&prev) != WH_CUDA_SUCCESS) prev = -1;
    if (prev != device) wh_cudart.SetDevice(device);
    return prev;
}
void wh_cudart_leave(int device, int prev) {
    if (prev >= 0 && prev != device) wh_cudart.SetDevice(prev);
}

void *wh_cuda_host_alloc(void *ctx, size_t size) {
    int dev = (int)(intptr_t)ctx, prev = wh_cudart_enter(dev);
    void *p = NULL;
    if (wh_cudart.HostAlloc(&p, size ? size : 1, WH_CUDA_HOST_ALLOC_PORTABLE) != WH_CUDA_SUCCESS)
        p = NULL;
    wh_cudart_leave(dev, prev);
    return p;
}

void wh_cuda_host_free(void *ctx, void *p, size_t size) {
    (void)ctx;
    (void)size;
    if (p) wh_cudart.FreeHost(p);
}
