/* The CUDA bindings (wh_cuda.c): cuda_init, the runtime probe; CudaStage,
 * the GPU stage; CudaError. */
#include "wh_py.h"

#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "wh_dlpack.h"
#include "wh_fault.h"
#include "wh_guard.h"

static PyObject *wh__cuda_init_py(PyObject *mod, PyObject *args) {
    wh_py_state_t *S = wh_py_mstate(mod);
    int device = 0;
    if (!PyArg_ParseTuple(args, "|i", &device)) return NULL;
    wh_err_t err = {0};
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_cuda_init(device, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh_py_raise(S, &err);
    return Py_BuildValue("{sssi}", "lib", wh_cuda_lib_name(), "runtime_version",
                         wh_cuda_runtime_version());
}

/* WIREHEAD_GPU_DIRECT_MIN_ROW: unset or empty 0, "off" (any case) UINT64_MAX,
 * else a byte count of decimal digits only (strtoull would read "1e9" as 1
 * and "-1" as the largest count); anything else false with err naming it. */
static bool wh__direct_env(uint64_t *v, wh_err_t *err) {
    const uint64_t most = (uint64_t)1 << 48;
    const char *e = getenv("WIREHEAD_GPU_DIRECT_MIN_ROW");
    *v = 0;
    if (!e || !*e) return true;
    if (!strcasecmp(e, "off")) {
        *v = UINT64_MAX;
        return true;
    }
    bool ok = true;
    for (const char *p = e; ok && *p; p++)
        ok = *p >= '0' && *p <= '9' && (*v = *v * 10 + (uint64_t)(*p - '0')) <= most;
    if (ok && *v >= 1) return true;
    return wh_err_set(err, WH_E_INVALID,
                      "WIREHEAD_GPU_DIRECT_MIN_ROW=%.40s is neither a row size in bytes "
                      "(decimal digits, 1..%llu) nor off",
                      e, (unsigned long long)most);
}

bool wh_py_gpu_direct_min(const char *uri, uint64_t *min, char *why, size_t cap, wh_err_t *err) {
    uint64_t env;
    wh_backend_info_t b = {0};
    why[0] = 0;
    *min = 0;
    if (!wh__direct_env(&env, err)) return false;
    if (env == UINT64_MAX)
        snprintf(why, cap, "WIREHEAD_GPU_DIRECT_MIN_ROW=off");
    else if (!wh_store_backend_of(uri, &b, NULL) || !(b.caps & WH_CAP_MAPPABLE))
        snprintf(why, cap,
                 "the store (backend %s) is read without LOCAL_CACHE: no mapping of it on this "
                 "node to register",
                 b.backend ? b.backend : "unknown");
    else if (!wh_cuda_can_register())
        snprintf(why, cap, "the CUDA runtime %s has no cudaHostRegister", wh_cuda_lib_name());
    if (!why[0]) *min = env ? env : WH_GPU_DIRECT_MIN_ROW;
    return true;
}

/* direct_min(uri) -> (bytes, why): rows at least this size go straight
 * from a store at uri (0: none, why says why). */
static PyObject *wh__stage_direct_min(PyObject *self, PyObject *arg) {
    const char *uri = PyUnicode_AsUTF8(arg);
    if (!uri) return NULL;
    char why[WH_ERR_LEN];
    uint64_t min;
    wh_err_t err = {0};
    if (!wh_py_gpu_direct_min(uri, &min, why, sizeof why, &err))
        return wh_py_raise(wh_py_tstate(self), &err);
    return Py_BuildValue("(Ks)", (unsigned long long)min, why);
}

int wh_py_gpu_stats_into(PyObject *d, const wh_gpu_stats_t *sp) {
    const wh_gpu_stats_t st = *sp;
    PyObject *x = Py_BuildValue(
        "{sKsKsdsKsdsKsIsIsKsKsKsssK}", "copies", (unsigned long long)st.copies, "h2d_bytes",
        (unsigned long long)st.h2d_bytes, "copy_s", (double)st.copy_ns / 1e9, "host_waits",
        (unsigned long long)st.host_waits, "host_wait_s", (double)st.host_wait_ns / 1e9,
        "stream_waits", (unsigned long long)st.stream_waits, "device_buffers", st.device_bufs,
        "pinned_buffers", st.pinned_bufs, "device_bytes", (unsigned long long)st.device_bytes,
        "host_copy_bytes", (unsigned long long)st.host_copy_bytes, "registrations",
        (unsigned long long)st.registrations, "staged_why", st.staged_why, "rereads",
        (unsigned long long)st.rereads);
    if (!x) return -1;
    int r = PyDict_Update(d, x);
    Py_DECREF(x);
    return r;
}

typedef struct {
    PyObject_HEAD wh_gpu_t *g;
    long pid;
    pthread_mutex_t mu;
    bool inited;
} wh__pystage_t;

static int wh__stage_init(wh__pystage_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"device", NULL};
    int device;
    if (self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "CudaStage already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i", kwlist, &device)) return -1;
    wh_err_t err = {0};
    Py_BEGIN_ALLOW_THREADS self->g = wh_gpu_new(device, &err);
    Py_END_ALLOW_THREADS if (!self->g) {
        wh_py_raise(S, &err);
        return -1;
    }
    pthread_mutex_init(&self->mu, NULL);
    self->pid = (long)getpid();
    self->inited = true;
    return 0;
}

static void wh__stage_close_g(wh__pystage_t *self) {
    if (!self->inited) return;
    wh_gpu_t *g;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    g = self->g;
    self->g = NULL;
    pthread_mutex_unlock(&self->mu);
    if ((long)getpid() == self->pid) wh_gpu_destroy(g); /* no CUDA calls after fork */
    Py_END_ALLOW_THREADS
}

static void wh__stage_dealloc(wh__pystage_t *self) {
    PyTypeObject *tp = Py_TYPE(self);
    wh__stage_close_g(self);
    if (self->inited) pthread_mutex_destroy(&self->mu);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static bool wh__stage_ok(wh__pystage_t *self) {
    wh_py_state_t *S = wh_py_tstate(self);
    if (!self->g) {
        PyErr_SetString(S->value, "CudaStage is closed");
        return false;
    }
    if ((long)getpid() != self->pid) {
        PyErr_SetString(S->cuda, "CUDA: a CudaStage cannot be used after fork (DataLoader "
                                 "workers must not create CUDA state)");
        return false;
    }
    return true;
}

typedef struct {
    const void *src;
    size_t n, off;
    int dtype, ndim;
    int64_t shape[WH_MAX_NDIM + 1];
} wh__stage_item_t;

static bool wh__stage_copy_c(wh_gpu_t *g, wh__stage_item_t *it, Py_ssize_t k, size_t total,
                             wh_buf_t **dev, wh_err_t *err) {
    wh_buf_t *h = wh_gpu_pinned(g, total, err);
    if (!h) return false;
    if (k) wh_fault_cut("stage-copy", it[0].src);
    for (Py_ssize_t i = 0; i < k; i++) memcpy((char *)h->data + it[i].off, it[i].src, it[i].n);
    /* a tensor over a shared file (a store view, a ring batch) cut under
     * the copy read zero pages: an error, not a batch */
    for (Py_ssize_t i = 0; i < k; i++)
        if (it[i].n && wh_guard_cut(it[i].src, NULL)) {
            wh_buf_unref(h);
            return wh_err_set(err, WH_E_CORRUPT,
                              "to_device: tensor %zd of the batch views a shared-memory file "
                              "(a store or a ring slot) that was truncated while it was copied; "
                              "its reader's next call names the file",
                              i);
        }
    *dev = wh_gpu_copy(g, h, total, err);
    wh_buf_unref(h); /* the stage holds it until the copy's event */
    return *dev != NULL;
}

/* copy([(data_ptr, nbytes, dtype, shape), ...]): the host bytes (C order,
 * alive for the call) through one page-locked buffer and one async copy;
 * returns device Arrays. */
static PyObject *wh__stage_copy(wh__pystage_t *self, PyObject *items) {
    wh_py_state_t *S = wh_py_tstate(self);
    if (!wh__stage_ok(self)) return NULL;
    PyObject *seq =
        PySequence_Fast(items, "copy() takes a sequence of (ptr, nbytes, dtype, shape)");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    wh__stage_item_t *it = PyMem_Calloc(k ? (size_t)k : 1, sizeof *it);
    PyObject *res = NULL;
    size_t total = 0;
    if (!it) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *ptr, *shape;
        unsigned long long n;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i),
                              "OKiO;copy() items are (ptr, "
                              "nbytes, dtype, shape)",
                              &ptr, &n, &it[i].dtype, &shape))
            goto out;
        it[i].src = PyLong_AsVoidPtr(ptr);
        if (PyErr_Occurred()) goto out;
        PyObject *sh = PySequence_Fast(shape, "shape must be a sequence");
        if (!sh) goto out;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(sh);
        uint64_t want = wh_dtype_size(it[i].dtype);
        bool bad = want == 0 || nd > WH_MAX_NDIM + 1;
        for (Py_ssize_t d = 0; !bad && d < nd; d++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(sh, d));
            bad = v < 0 || !wh_mul_ok(want, (uint64_t)v, &want);
            it[i].shape[d] = v;
        }
        Py_DECREF(sh);
        if (PyErr_Occurred()) goto out;
        if (bad || want != n) {
            PyErr_Format(S->value,
                         "copy() item %zd: %llu bytes do not match dtype %d and "
                         "its shape (at most %d dims)",
                         i, n, it[i].dtype, WH_MAX_NDIM + 1);
            goto out;
        }
        it[i].ndim = (int)nd;
        it[i].n = n;
        it[i].off = total;
        total += WH_ALIGN_UP(n);
    }
    wh_err_t err = {0};
    wh_buf_t *dev = NULL;
    bool ok;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    ok = self->g ? wh__stage_copy_c(self->g, it, k, total, &dev, &err)
                 : wh_err_set(&err, WH_E_INVALID, "CudaStage is closed");
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS if (!ok) {
        wh_py_raise(S, &err);
        goto out;
    }
    res = PyList_New(k);
    for (Py_ssize_t i = 0; res && i < k; i++) {
        wh_py_list_put(
            &res, i, wh_array_new(S->array, dev, it[i].off, it[i].dtype, it[i].ndim, it[i].shape));
    }
    wh_buf_unref(dev);
out:
    PyMem_Free(it);
    Py_DECREF(seq);
    return res;
}

/* A copy of a batch whose rows a worker left in the store, run with the
 * store's handle. */
typedef struct {
    wh__pystage_t *self;
    wh_buf_t *held;
    const wh_batch_wire_t *w;
    wh_buf_t *dev;
    bool direct, reread;
} wh__rows_call_t;

/* with the store's handle (GIL released, its mutex held) */
static bool wh__rows_run(wh_store_t *st, void *ctx, wh_err_t *err) {
    wh__rows_call_t *c = ctx;
    pthread_mutex_lock(&c->self->mu);
    if (c->self->g)
        c->dev = wh_gpu_copy_slot_rows(c->self->g, c->held, st, c->w, &c->direct, &c->reread, err);
    else
        wh_err_set(err, WH_E_INVALID, "CudaStage is closed");
    pthread_mutex_unlock(&c->self->mu);
    return c->dev != NULL;
}

/* copy_slot(mem, *, wire=None, store=None): a ring batch (mem: the uint8
 * Array that Ring.claim or Ring.local gave, or heap memory) as one uint8
 * device Array of its bytes, copied straight from the registered slot; the
 * slot is held until the copy's event. wire: the batch's layout as its
 * handle carried it (ring_fill's), checked against the slot; where it
 * names rows a worker left in the store, those are copied from store (this
 * process's Store) too. Returns (device Array, direct, reread): direct is
 * False where the batch went staged (a refused registration:
 * stats()["staged_why"] says why; or heap memory, no slot); reread where
 * its rows were read again here (their generation was reclaimed). */
static PyObject *wh__stage_copy_slot(wh__pystage_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"mem", "wire", "store", NULL};
    PyObject *mem, *store = Py_None;
    Py_buffer wire = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$y*O", kwlist, &mem, &wire, &store)) return NULL;
    PyObject *res = NULL;
    wh_batch_wire_t w;
    wh_err_t err = {0};
    memset(&w, 0, sizeof w);
    if (!wh__stage_ok(self)) goto out;
    if (!PyObject_TypeCheck(mem, S->array)) {
        PyErr_Format(PyExc_TypeError, "copy_slot() takes a wirehead Array, got %s",
                     Py_TYPE(mem)->tp_name);
        goto out;
    }
    wh_array_obj_t *a = (wh_array_obj_t *)mem;
    if (a->offset != 0 || a->buf->device_type != 1) {
        PyErr_Format(S->value, "copy_slot(): not a whole host batch buffer");
        goto out;
    }
    wh_buf_t *held = a->buf, *dev = NULL;
    if (wire.buf && !wh_batch_wire_read(wire.buf, (size_t)wire.len, held->size, &w, &err)) {
        wh_py_raise(S, &err);
        goto out;
    }
    bool direct = false, reread = false;
    if (w.b.direct) { /* rows left in the store */
        if (store == Py_None) {
            PyErr_SetString(PyExc_TypeError, "copy_slot(): a batch with rows left in the store "
                                             "needs store=");
            goto out;
        }
        wh__rows_call_t c = {self, held, &w, NULL, false, false};
        bool ok = false;
        if (wh_py_store_call(S, store, wh__rows_run, &c, &ok, &err) < 0) goto out;
        dev = c.dev;
        direct = c.direct;
        reread = c.reread;
    } else {
        Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
        if (self->g)
            dev = wh_gpu_copy_slot(self->g, held, &direct, &err);
        else
            wh_err_set(&err, WH_E_INVALID, "CudaStage is closed");
        pthread_mutex_unlock(&self->mu);
        Py_END_ALLOW_THREADS
    }
    if (!dev) {
        wh_py_raise(S, &err);
        goto out;
    }
    int64_t n = (int64_t)dev->size;
    PyObject *arr = wh_array_new(S->array, dev, 0, WH_DT_U8, 1, &n);
    wh_buf_unref(dev);
    if (arr)
        res = Py_BuildValue("(NOO)", arr, direct ? Py_True : Py_False, reread ? Py_True : Py_False);
out:
    if (wire.buf) PyBuffer_Release(&wire);
    return res;
}

static PyObject *wh__stage_stats(wh__pystage_t *self, PyObject *unused) {
    (void)unused;
    if (!wh__stage_ok(self)) return NULL;
    wh_gpu_stats_t st;
    bool open;
    /* under the lock: a close in another thread frees the stage */
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    open = self->g != NULL;
    if (open) wh_gpu_stats(self->g, &st);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS if (!open) {
        wh__stage_ok(self); /* sets "closed" */
        return NULL;
    }
    PyObject *d = PyDict_New();
    if (d && wh_py_gpu_stats_into(d, &st) < 0) Py_CLEAR(d);
    return d;
}

static PyObject *wh__stage_poll(wh__pystage_t *self, PyObject *unused) {
    (void)unused;
    if (!wh__stage_ok(self)) return NULL;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    if (self->g) wh_gpu_poll(self->g);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *wh__stage_close(wh__pystage_t *self, PyObject *unused) {
    (void)unused;
    wh__stage_close_g(self);
    Py_RETURN_NONE;
}

static PyMethodDef wh__stage_methods[] = {
    {"copy", (PyCFunction)wh__stage_copy, METH_O,
     "copy([(ptr, nbytes, dtype, shape), ...]) -> device Arrays (pinned ring, async copy)"},
    {"copy_slot", (PyCFunction)(void (*)(void))wh__stage_copy_slot, METH_VARARGS | METH_KEYWORDS,
     "copy_slot(mem, *, wire=None, store=None) -> (device Array, direct, reread): a ring batch "
     "straight from its registered slot; the rows its layout (wire) says a worker left in the "
     "store straight from views of store"},
    {"direct_min", (PyCFunction)wh__stage_direct_min, METH_O,
     "direct_min(uri) -> (bytes, why): the cut-over for rows copied straight from a store at "
     "uri, 0 and why where there is none"},
    {"poll", (PyCFunction)wh__stage_poll, METH_NOARGS,
     "let go of the host buffers (ring slots) whose copies completed"},
    {"stats", (PyCFunction)wh__stage_stats, METH_NOARGS, "copy counters"},
    {"close", (PyCFunction)wh__stage_close, METH_NOARGS, "free the stage (exports stay valid)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot wh__stage_slots[] = {
    {Py_tp_init, wh__stage_init},
    {Py_tp_dealloc, wh__stage_dealloc},
    {Py_tp_methods, wh__stage_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "Host-to-device copies through page-locked memory on a side stream."},
    {0, NULL},
};

static PyType_Spec wh__stage_spec = {
    "wirehead_torch._C.CudaStage", sizeof(wh__pystage_t), 0, Py_TPFLAGS_DEFAULT, wh__stage_slots,
};

static PyMethodDef wh__cuda_methods[] = {
    {"cuda_init", wh__cuda_init_py, METH_VARARGS,
     "cuda_init(device=0): load the CUDA runtime, check the device; {lib, runtime_version}"},
    {NULL, NULL, 0, NULL},
};

int wh_py_cuda_exec(PyObject *m, wh_py_state_t *S) {
    PyObject *b = PyTuple_Pack(2, S->base, PyExc_RuntimeError);
    int r = b ? wh_py_add_exc(m, &S->cuda, "CudaError", b, "The CUDA runtime is missing or failed.")
              : -1;
    Py_XDECREF(b);
    if (r < 0 || wh_py_add_type(m, &S->stage, &wh__stage_spec) < 0) return -1;
    return PyModule_AddFunctions(m, wh__cuda_methods);
}
