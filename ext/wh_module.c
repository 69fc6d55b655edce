/* wirehead_torch._C: the only file with the module definition. Converts
 * wh_err_t into Python exceptions; releases the GIL around every store call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wh_cuda.h"
#include "wh_dlpack.h"
#include "wh_fault.h"
#include "wh_loader.h"
#include "wh_plan.h"
#include "wh_store.h"
#include "wh_backend.h" /* only for shm_layout, which tests use to forge damage */
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* XXH3 with the widest SIMD the CPU has, chosen at run time */
#endif

/* Module state (multi-phase init, PEP 489): this module instance's
 * exceptions and types. Methods reach it through their type, which is bound
 * to the module (PyType_FromModuleAndSpec), so an object made by one
 * instance raises that instance's exceptions, and the module lives as long
 * as any of its objects. */
typedef struct {
    PyObject *base, *value, *schema, *gone, *corrupt, *nospace, *toobig, *timeout, *unavail,
        *notfound, *nostore, *lease, *pinned, *cuda;
    PyTypeObject *array, *store, *loader, *map, *stage, *hasher;
} wh__state_t;

/* one X() per field, laid out by hand */
/* clang-format off */
#define WH__STATE_FIELDS(X)                                                                   \
    X(base) X(value) X(schema) X(gone) X(corrupt) X(nospace) X(toobig) X(timeout) X(unavail) \
    X(notfound) X(nostore) X(lease) X(pinned) X(cuda) X(array) X(store) X(loader) X(map) X(stage) \
    X(hasher)
/* clang-format on */
#define WH__ONE(f) +1
_Static_assert(sizeof(wh__state_t) == (0 WH__STATE_FIELDS(WH__ONE)) * sizeof(void *),
               "WH__STATE_FIELDS names every field of the module state");
#undef WH__ONE

static wh__state_t *wh__mstate(PyObject *module) {
    return (wh__state_t *)PyModule_GetState(module);
}

/* The state of the module whose type made self (the types are final). */
static wh__state_t *wh__tstate(void *self) {
    return (wh__state_t *)PyType_GetModuleState(Py_TYPE((PyObject *)self));
}

static PyObject *wh__raise(wh__state_t *S, const wh_err_t *err) {
    PyObject *cls = S->base;
    switch (err->code) {
    case WH_E_INVALID: cls = S->value; break;
    case WH_E_SCHEMA: cls = S->schema; break;
    case WH_E_GONE: cls = S->gone; break;
    case WH_E_CORRUPT: cls = S->corrupt; break;
    case WH_E_NOSPACE: cls = S->nospace; break;
    case WH_E_TOOBIG: cls = S->toobig; break;
    case WH_E_TIMEOUT: cls = S->timeout; break;
    case WH_E_UNAVAIL: cls = S->unavail; break;
    case WH_E_NOTFOUND: cls = S->notfound; break;
    case WH_E_NOSTORE: cls = S->nostore; break;
    case WH_E_LEASE: cls = S->lease; break;
    case WH_E_PINNED: cls = S->pinned; break;
    case WH_E_CUDA: cls = S->cuda; break;
    default: break;
    }
    PyErr_SetString(cls, err->message[0] ? err->message : "wirehead_torch: unknown error");
    return NULL;
}

/* A tuple of ndim ints, or NULL with an exception set. */
static PyObject *wh__shape_tuple(int ndim, const int64_t *shape) {
    PyObject *t = PyTuple_New(ndim);
    for (int d = 0; t && d < ndim; d++) {
        PyObject *v = PyLong_FromLongLong(shape[d]);
        if (!v)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, d, v);
    }
    return t;
}

/* Item i of *list (a new list) is item; a failed item (NULL) drops the list. */
static void wh__list_put(PyObject **list, Py_ssize_t i, PyObject *item) {
    if (!item)
        Py_CLEAR(*list);
    else
        PyList_SET_ITEM(*list, i, item);
}

/* ---- Array (wh_dlpack.c): a C buffer exported through DLPack ---- */

static void wh__array_dealloc(wh_array_obj_t *a) {
    PyTypeObject *tp = Py_TYPE(a);
    wh_buf_unref(a->buf);
    PyObject_Free(a);
    Py_DECREF(tp);
}

static PyObject *wh__array_device(wh_array_obj_t *a, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(ii)", a->buf->device_type, a->buf->device_id);
}

static PyObject *wh__array_get_dtype(wh_array_obj_t *a, void *c) {
    (void)c;
    return PyUnicode_FromString(wh_dtype_name(a->dtype));
}

static PyObject *wh__array_get_shape(wh_array_obj_t *a, void *c) {
    (void)c;
    return wh__shape_tuple(a->ndim, a->shape);
}

static PyObject *wh__array_get_ptr(wh_array_obj_t *a, void *c) {
    (void)c;
    return PyLong_FromVoidPtr((char *)a->buf->data + a->offset);
}

static PyObject *wh__array_get_buf(wh_array_obj_t *a, void *c) {
    (void)c;
    return PyLong_FromVoidPtr(a->buf);
}

static PyMethodDef wh__array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))wh_array_dlpack, METH_VARARGS | METH_KEYWORDS,
     "DLPack capsule sharing this buffer (versioned if max_version >= (1, 0))."},
    {"__dlpack_device__", (PyCFunction)wh__array_device, METH_NOARGS, "(device_type, device_id)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wh__array_getset[] = {
    {"dtype", (getter)wh__array_get_dtype, NULL, "stored dtype name", NULL},
    {"shape", (getter)wh__array_get_shape, NULL, "shape", NULL},
    {"data_ptr", (getter)wh__array_get_ptr, NULL, "address of element 0", NULL},
    {"buffer_id", (getter)wh__array_get_buf, NULL, "identity of the C buffer", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot wh__array_slots[] = {
    {Py_tp_dealloc, wh__array_dealloc},
    {Py_tp_methods, wh__array_methods},
    {Py_tp_getset, wh__array_getset},
    {Py_tp_doc, "A C buffer exported through DLPack (torch.from_dlpack / numpy.from_dlpack)."},
    {0, NULL},
};

/* Arrays come only from the store and the loaders: Array() would have no buffer. */
#ifdef Py_TPFLAGS_DISALLOW_INSTANTIATION
#define WH__ARRAY_FLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION)
#else
#define WH__ARRAY_FLAGS Py_TPFLAGS_DEFAULT
#endif

static PyType_Spec wh__array_spec = {
    "wirehead_torch._C.Array", sizeof(wh_array_obj_t), 0, WH__ARRAY_FLAGS, wh__array_slots,
};

/* ---- store configuration from keyword arguments ---- */

typedef struct {
    wh_store_config_t cfg;
    PyObject *keep; /* owns the UTF-8 strings cfg points into */
} wh__cfgbuf_t;

static const char *wh__opt_str(PyObject *o, PyObject *keep) {
    if (!o || o == Py_None) return NULL;
    PyObject *b = PyUnicode_AsUTF8String(o);
    if (!b) return NULL;
    PyList_Append(keep, b);
    Py_DECREF(b);
    return PyBytes_AS_STRING(b);
}

static bool wh__parse_cfg(wh__state_t *S, PyObject *args, PyObject *kw, wh__cfgbuf_t *out) {
    static char *kwlist[] = {"uri",    "swap_cap", "fields",  "byte_budget",       "chunk_bytes",
                             "dbname", "prefix",   "lease_s", "connect_timeout_s", "verify_reads",
                             "create", NULL};
    PyObject *uri, *fields, *dbname = Py_None, *prefix = Py_None;
    unsigned long swap_cap = 0;
    unsigned long long byte_budget = 0, chunk_bytes = 4ull << 20; /* 0: auto */
    double lease_s = 10.0, connect_timeout_s = 10.0;
    int verify = 1, create = 1;
    memset(out, 0, sizeof *out);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UkO|KKOOddpp", kwlist, &uri, &swap_cap, &fields,
                                     &byte_budget, &chunk_bytes, &dbname, &prefix, &lease_s,
                                     &connect_timeout_s, &verify, &create))
        return false;
    out->keep = PyList_New(0);
    if (!out->keep) return false;
    wh_store_config_t *c = &out->cfg;
    c->uri = wh__opt_str(uri, out->keep);
    c->dbname = wh__opt_str(dbname, out->keep);
    c->prefix = wh__opt_str(prefix, out->keep);
    if (PyErr_Occurred()) goto fail;
    if (swap_cap == 0 || swap_cap > (1ul << 30)) {
        PyErr_SetString(S->value, "SWAP_CAP must be between 1 and 2**30");
        goto fail;
    }
    if (!(lease_s > 0 && lease_s < 1e6) || !(connect_timeout_s > 0 && connect_timeout_s < 1e6)) {
        PyErr_SetString(S->value, "LEASE_SECONDS and CONNECT_TIMEOUT must be positive "
                                  "numbers of seconds below 10^6");
        goto fail;
    }
    c->swap_cap = (uint32_t)swap_cap;
    c->byte_budget = byte_budget;
    c->chunk_bytes = chunk_bytes;
    c->lease_s = lease_s;
    c->connect_timeout_s = connect_timeout_s;
    c->verify_reads = verify;
    c->no_create = !create;
    PyObject *seq = PySequence_Fast(fields, "fields must be a sequence of names");
    if (!seq) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char *names[WH_MAX_FIELDS];
    if (n > WH_MAX_FIELDS) n = WH_MAX_FIELDS + 1; /* let schema_init report it */
    for (Py_ssize_t i = 0; i < n && i < WH_MAX_FIELDS; i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, i);
        names[i] = PyUnicode_Check(s) ? wh__opt_str(s, out->keep) : NULL;
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            goto fail;
        }
    }
    Py_DECREF(seq);
    wh_err_t err = {0};
    if (!wh_schema_init(&c->schema, (int)n, names, &err)) {
        wh__raise(S, &err);
        goto fail;
    }
    return true;
fail:
    Py_CLEAR(out->keep);
    return false;
}

/* ---- Store ---- */

typedef struct {
    PyObject_HEAD wh_store_t *st;
    pthread_mutex_t mu; /* one C call at a time per handle; lives until dealloc */
    bool inited;
    int nfields; /* copies, readable after close */
    uint32_t swap_cap;
} wh__pystore_t;

static int wh__store_init(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh__cfgbuf_t cb;
    if (self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "Store already initialised");
        return -1;
    }
    if (!wh__parse_cfg(wh__tstate(self), args, kw, &cb)) return -1;
    wh_err_t err = {0};
    wh_store_t *st;
    Py_BEGIN_ALLOW_THREADS st = wh_store_open(&cb.cfg, &err);
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!st) {
        wh__raise(wh__tstate(self), &err);
        return -1;
    }
    pthread_mutex_init(&self->mu, NULL);
    self->st = st;
    self->inited = true;
    self->nfields = wh_store_config(st)->schema.nfields;
    self->swap_cap = wh_store_config(st)->swap_cap;
    return 0;
}

static void wh__store_dealloc(wh__pystore_t *self) {
    PyTypeObject *tp = Py_TYPE(self);
    if (self->inited) {
        wh_store_destroy(self->st);
        pthread_mutex_destroy(&self->mu);
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static bool wh__open(wh__pystore_t *self) {
    if (!self->st) PyErr_SetString(wh__tstate(self)->value, "store is closed");
    return self->st != NULL;
}

/* Runs expr with the GIL released and the handle's mutex held. handle is
 * the field (st or ld) checked under the mutex: a close() from another
 * thread may have detached it meanwhile, which reads as "closed". */
#define WH__CALL(self, handle, ok, err, expr)                                                      \
    do {                                                                                           \
        Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&(self)->mu);                                    \
        if ((self)->handle)                                                                        \
            ok = (expr);                                                                           \
        else                                                                                       \
            ok = wh_err_set(err, WH_E_INVALID, "the handle was closed");                           \
        pthread_mutex_unlock(&(self)->mu);                                                         \
        Py_END_ALLOW_THREADS                                                                       \
    } while (0)

static PyObject *wh__store_close(wh__pystore_t *self, PyObject *unused) {
    (void)unused;
    if (self->inited) {
        wh_store_t *st;
        Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(
            &self->mu); /* waits for a call in another thread */
        st = self->st;
        self->st = NULL;
        pthread_mutex_unlock(&self->mu);
        wh_store_destroy(st);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* put(arrays, wait_ms=100): arrays is a sequence of (buffer, dtype_code). */
static PyObject *wh__store_put(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__tstate(self);
    static char *kwlist[] = {"arrays", "wait_ms", NULL};
    PyObject *arrays;
    unsigned int wait_ms = 100;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|I", kwlist, &arrays, &wait_ms)) return NULL;
    if (!wh__open(self)) return NULL;
    PyObject *seq = PySequence_Fast(arrays, "arrays must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > WH_MAX_FIELDS) {
        Py_DECREF(seq);
        PyErr_Format(S->value, "sample has %zd fields, at most %d", n, WH_MAX_FIELDS);
        return NULL;
    }
    Py_buffer views[WH_MAX_FIELDS];
    wh_array_t arr[WH_MAX_FIELDS];
    int got = 0;
    PyObject *res = NULL;
    for (; got < n; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got), *obj;
        int code;
        if (!PyArg_ParseTuple(item, "Oi;each array must be (buffer, dtype_code)", &obj, &code))
            goto out;
        size_t isz = wh_dtype_size(code);
        if (!isz) {
            PyErr_Format(S->value, "field %d: unknown dtype code %d", got, code);
            goto out;
        }
        if (PyObject_GetBuffer(obj, &views[got], PyBUF_RECORDS_RO) < 0) goto out;
        Py_buffer *v = &views[got];
        if ((size_t)v->itemsize != isz || v->ndim > WH_MAX_NDIM) {
            PyErr_Format(S->value, "field %d: itemsize %zd or ndim %d does not fit dtype %s", got,
                         v->itemsize, v->ndim, wh_dtype_name(code));
            PyBuffer_Release(v);
            goto out;
        }
        arr[got].dtype = code;
        arr[got].ndim = v->ndim;
        arr[got].data = v->buf;
        for (int d = 0; d < v->ndim; d++) {
            arr[got].shape[d] = v->shape[d];
            arr[got].strides[d] = v->strides ? v->strides[d] : 0;
        }
        if (!v->strides) { /* C-contiguous exporter */
            int64_t s = (int64_t)isz;
            for (int d = v->ndim - 1; d >= 0; d--) {
                arr[got].strides[d] = s;
                s *= v->shape[d];
            }
        }
    }
    {
        wh_err_t err = {0};
        wh_put_status_t status = WH_PUT_WAIT;
        uint64_t gen = 0;
        bool ok;
        WH__CALL(self, st, ok, &err,
                 wh_store_put(self->st, arr, (int)n, wait_ms, &status, &gen, &err));
        res = ok ? Py_BuildValue("(iK)", (int)status, (unsigned long long)gen) : wh__raise(S, &err);
    }
out:
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    Py_DECREF(seq);
    return res;
}

static PyObject *wh__store_lead(wh__pystore_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    bool ok, leader = false;
    WH__CALL(self, st, ok, &err, wh_store_lead(self->st, &leader, &err));
    if (!ok) return wh__raise(S, &err);
    return PyBool_FromLong(leader);
}

static PyObject *wh__store_resign(wh__pystore_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    bool ok;
    WH__CALL(self, st, ok, &err, wh_store_resign(self->st, &err));
    if (!ok) return wh__raise(S, &err);
    Py_RETURN_NONE;
}

static PyObject *wh__store_seal(wh__pystore_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    wh_seal_info_t info = {0};
    bool ok, sealed = false;
    WH__CALL(self, st, ok, &err, wh_store_seal(self->st, &sealed, &info, &err));
    if (!ok) return wh__raise(S, &err);
    if (!sealed && info.blocked_pid && info.blocked_reader)
        return Py_BuildValue("{sKsOsK}", "blocked_pid", (unsigned long long)info.blocked_pid,
                             "blocked_reader", Py_True, "blocked_gen",
                             (unsigned long long)info.blocked_gen);
    if (!sealed && info.blocked_pid)
        return Py_BuildValue("{sK}", "blocked_pid", (unsigned long long)info.blocked_pid);
    if (!sealed) Py_RETURN_NONE;
    return Py_BuildValue("{sKsKsKsd}", "generation", (unsigned long long)info.generation,
                         "generated", (unsigned long long)info.generated, "discarded",
                         (unsigned long long)info.discarded, "seal_s", (double)info.seal_ns / 1e9);
}

static PyObject *wh__store_current(wh__pystore_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    uint64_t gen = 0;
    bool ok;
    WH__CALL(self, st, ok, &err, wh_store_current(self->st, &gen, &err));
    if (!ok) return wh__raise(S, &err);
    return PyLong_FromUnsignedLongLong(gen);
}

typedef struct {
    uint32_t want; /* bit i: field i requested */
    wh_buf_t *bufs[WH_MAX_FIELDS];
} wh__readctx_t;

/* Called once per attempt of the read policy: a retry (a generation
 * reclaimed mid-copy, a corrupt sample skipped) reuses the last attempt's
 * buffer of a field when its size fits, else returns it to the pool first,
 * so a read holds one buffer per field whatever it retried. */
static bool wh__read_dest(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err) {
    wh__readctx_t *c = ctx;
    for (int i = 0; i < WH_MAX_FIELDS; i++) {
        bool want = i < meta->nfields && (c->want & (1u << i));
        if (c->bufs[i] && (!want || c->bufs[i]->size != meta->f[i].nbytes)) {
            wh_buf_unref(c->bufs[i]);
            c->bufs[i] = NULL;
        }
        if (!want) continue;
        if (c->bufs[i]) {
            dst[i] = c->bufs[i]->data;
            continue;
        }
        c->bufs[i] = wh_buf_new(meta->f[i].nbytes);
        if (!c->bufs[i])
            return wh_err_set(err, WH_E_SYS, "out of memory for a %llu-byte field",
                              (unsigned long long)meta->f[i].nbytes);
        dst[i] = c->bufs[i]->data;
    }
    return true;
}

/* want (None: every field) as a bit mask of field indices. */
static bool wh__want_mask(wh__state_t *S, int nf, PyObject *want, uint32_t *mask) {
    *mask = 0;
    if (want == Py_None) {
        *mask = (nf >= 32) ? 0xffffffffu : ((1u << nf) - 1);
        return true;
    }
    PyObject *seq = PySequence_Fast(want, "want must be a sequence of field indices");
    if (!seq) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (k < 0 || k >= nf) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_Format(S->value, "field index %ld out of range", k);
            return false;
        }
        *mask |= 1u << k;
    }
    Py_DECREF(seq);
    return true;
}

/* List of Array, one per field: field i in bufs[i] (at its offset in the
 * encoded sample when in_sample, i.e. a view; else at 0), None where
 * bufs[i] is NULL (not wanted). Each Array holds a reference to its buffer. */
static PyObject *wh__array_list(wh__state_t *S, int nf, wh_buf_t *const *bufs, bool in_sample,
                                const wh_sample_meta_t *meta) {
    PyObject *out = PyList_New(nf);
    for (int i = 0; out && i < nf; i++) {
        PyObject *a = Py_None;
        if (bufs[i]) {
            a = wh_array_new(S->array, bufs[i], in_sample ? meta->f[i].offset : 0, meta->f[i].dtype,
                             meta->f[i].ndim, meta->f[i].shape);
        } else {
            Py_INCREF(a);
        }
        wh__list_put(&out, i, a);
    }
    return out;
}

/* read(gen, pos, want=None) -> list of Array (None for fields not wanted);
 * exactly that sample or an error, no retry. */
static PyObject *wh__store_read(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__tstate(self);
    static char *kwlist[] = {"gen", "pos", "want", NULL};
    unsigned long long gen;
    unsigned int pos;
    PyObject *want = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KI|O", kwlist, &gen, &pos, &want)) return NULL;
    if (!wh__open(self)) return NULL;
    wh__readctx_t ctx = {0};
    if (!wh__want_mask(S, self->nfields, want, &ctx.want)) return NULL;
    wh_err_t err = {0};
    wh_sample_meta_t meta;
    bool ok;
    WH__CALL(self, st, ok, &err,
             wh_store_read(self->st, gen, pos, wh__read_dest, &ctx, &meta, &err));
    PyObject *out =
        ok ? wh__array_list(S, self->nfields, ctx.bufs, false, &meta) : wh__raise(S, &err);
    for (int i = 0; i < WH_MAX_FIELDS; i++) wh_buf_unref(ctx.bufs[i]);
    return out;
}

/* Arguments (gen, pos, want=None, timeout=60.0, skip=True) of read_sample
 * and view_sample. */
static bool wh__parse_at(wh__pystore_t *self, PyObject *args, PyObject *kw, wh_read_at_t *at,
                         uint32_t *mask, double *timeout) {
    wh__state_t *S = wh__tstate(self);
    static char *kwlist[] = {"gen", "pos", "want", "timeout", "skip", NULL};
    unsigned long long gen;
    unsigned int pos;
    PyObject *want = Py_None;
    int skip = 1;
    *timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KI|Odp", kwlist, &gen, &pos, &want, timeout,
                                     &skip) ||
        !wh__open(self) || !wh__want_mask(S, self->nfields, want, mask))
        return false;
    memset(at, 0, sizeof *at);
    at->gen = gen;
    at->pos = pos;
    at->strict = !skip;
    return true;
}

/* (gen, pos, is_pad, arrays, skipped) of a policy read; steals arrs. */
static PyObject *wh__at_result(const wh_read_at_t *at, PyObject *arrs) {
    if (!arrs) return NULL;
    PyObject *out =
        Py_BuildValue("KIOOs", (unsigned long long)at->gen, at->pos, at->pad ? Py_True : Py_False,
                      arrs, at->corrupt ? at->last_skip : NULL);
    Py_DECREF(arrs);
    return out;
}

/* read_sample(gen, pos, want=None, timeout=60.0, skip=True) -> (gen, pos,
 * is_pad, arrays, skipped): the one read policy (wh_store_read_sample):
 * moves to the newest generation when gen (0: the newest) was reclaimed,
 * skips a corrupt sample for its neighbour (is_pad True, skipped says why)
 * or, with skip=False, raises CorruptSampleError. */
static PyObject *wh__store_read_sample(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__tstate(self);
    wh__readctx_t ctx = {0};
    wh_read_at_t at;
    double timeout;
    if (!wh__parse_at(self, args, kw, &at, &ctx.want, &timeout)) return NULL;
    wh_err_t err = {0};
    wh_sample_meta_t meta;
    bool ok;
    WH__CALL(self, st, ok, &err,
             wh_store_read_sample(self->st, &at, timeout, NULL, wh__read_dest, &ctx, &meta, &err));
    PyObject *out =
        ok ? wh__at_result(&at, wh__array_list(S, self->nfields, ctx.bufs, false, &meta))
           : wh__raise(S, &err);
    for (int i = 0; i < WH_MAX_FIELDS; i++) wh_buf_unref(ctx.bufs[i]);
    return out;
}

/* wait_generation(newer_than=0, timeout=60.0) -> newest read generation
 * other than newer_than, waiting with the read policy's backoff. */
static PyObject *wh__store_wait_generation(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__tstate(self);
    static char *kwlist[] = {"newer_than", "timeout", NULL};
    unsigned long long newer = 0;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Kd", kwlist, &newer, &timeout)) return NULL;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    uint64_t gen = 0;
    bool ok;
    WH__CALL(self, st, ok, &err, wh_store_wait_gen(self->st, newer, timeout, NULL, &gen, &err));
    if (!ok) return wh__raise(S, &err);
    return PyLong_FromUnsignedLongLong(gen);
}

/* view_sample(gen, pos, want=None, timeout=60.0, skip=True) -> as
 * read_sample, but the arrays view the store (read-only, pinned until the
 * last of them dies) instead of holding copies. shm:// only. */
static PyObject *wh__store_view_sample(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__tstate(self);
    uint32_t mask;
    wh_read_at_t at;
    double timeout;
    if (!wh__parse_at(self, args, kw, &at, &mask, &timeout)) return NULL;
    wh_err_t err = {0};
    wh_sample_meta_t meta;
    wh_buf_t *v = NULL;
    bool ok;
    WH__CALL(self, st, ok, &err,
             wh_store_view_sample(self->st, &at, timeout, NULL, &v, &meta, &err));
    if (!ok) return wh__raise(S, &err);
    wh_buf_t *bufs[WH_MAX_FIELDS] = {0};
    for (int i = 0; i < self->nfields; i++)
        if (mask & (1u << i)) bufs[i] = v; /* every Array holds the view, hence the pin */
    PyObject *out = wh__at_result(&at, wh__array_list(S, self->nfields, bufs, true, &meta));
    wh_buf_unref(v); /* the arrays hold their own references */
    return out;
}

typedef struct {
    Py_buffer *views;
    int n;
} wh__intoctx_t;

static bool wh__into_dest(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err) {
    wh__intoctx_t *c = ctx;
    for (int i = 0; i < meta->nfields && i < c->n; i++) {
        if (!c->views[i].buf) continue;
        if ((uint64_t)c->views[i].len != meta->f[i].nbytes)
            return wh_err_set(err, WH_E_INVALID,
                              "field %d: buffer has %zd bytes, the sample's "
                              "field has %llu",
                              i, c->views[i].len, (unsigned long long)meta->f[i].nbytes);
        dst[i] = c->views[i].buf;
    }
    return true;
}

/* Writable C-contiguous views of bufs (None: field skipped) into views[];
 * *got counts the entries filled, each to be released by the caller. */
static bool wh__get_views(wh__state_t *S, PyObject *seq, Py_buffer *views, int *got) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > WH_MAX_FIELDS) {
        PyErr_SetString(S->value, "too many buffers");
        return false;
    }
    for (; *got < n; (*got)++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, *got);
        if (o != Py_None &&
            PyObject_GetBuffer(o, &views[*got], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            return false;
    }
    return true;
}

/* [(dtype name, shape tuple) or None] for the fields copied into views. */
static PyObject *wh__layouts(const Py_buffer *views, int n, const wh_sample_meta_t *meta) {
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *o = Py_None;
        if (views[i].buf && i < meta->nfields) {
            const wh_field_meta_t *f = &meta->f[i];
            PyObject *shape = wh__shape_tuple(f->ndim, f->shape);
            o = shape ? Py_BuildValue("(sN)", wh_dtype_name(f->dtype), shape) : NULL;
            if (!o) {
                Py_CLEAR(out);
                break;
            }
        } else {
            Py_INCREF(o);
        }
        PyList_SET_ITEM(out, i, o);
    }
    return out;
}

/* Copies (gen, pos) into the caller's buffers (a sequence; None skips a
 * field), with the read policy when at is given (at->gen/pos set), else
 * exactly that sample. Returns the fields' layouts (wh__layouts). */
static PyObject *wh__read_bufs(wh__pystore_t *self, uint64_t gen, uint32_t pos, PyObject *bufs,
                               wh_read_at_t *at, double timeout) {
    wh__state_t *S = wh__tstate(self);
    if (!wh__open(self)) return NULL;
    PyObject *seq = PySequence_Fast(bufs, "buffers must be a sequence");
    if (!seq) return NULL;
    Py_buffer views[WH_MAX_FIELDS];
    memset(views, 0, sizeof views);
    PyObject *res = NULL;
    int got = 0;
    if (wh__get_views(S, seq, views, &got)) {
        wh__intoctx_t ctx = {views, got};
        wh_err_t err = {0};
        wh_sample_meta_t meta;
        bool ok;
        if (at)
            WH__CALL(self, st, ok, &err,
                     wh_store_read_sample(self->st, at, timeout, NULL, wh__into_dest, &ctx, &meta,
                                          &err));
        else
            WH__CALL(self, st, ok, &err,
                     wh_store_read(self->st, gen, pos, wh__into_dest, &ctx, &meta, &err));
        res = ok ? wh__layouts(views, got, &meta) : wh__raise(S, &err);
    }
    for (int i = 0; i < got; i++)
        if (views[i].buf) PyBuffer_Release(&views[i]);
    Py_DECREF(seq);
    return res;
}

/* read_into(gen, pos, buffers): copies each field into the caller's writable
 * C-contiguous buffer of exactly its size (None skips a field). */
static PyObject *wh__store_read_into(wh__pystore_t *self, PyObject *args) {
    unsigned long long gen;
    unsigned int pos;
    PyObject *bufs;
    if (!PyArg_ParseTuple(args, "KIO", &gen, &pos, &bufs)) return NULL;
    PyObject *lay = wh__read_bufs(self, gen, pos, bufs, NULL, 0);
    if (!lay) return NULL;
    Py_DECREF(lay);
    Py_RETURN_NONE;
}

/* read_sample_into(gen, pos, buffers, timeout=60.0, skip=True) -> (gen, pos,
 * is_pad, layouts, skipped): read_sample's policy, copying each field once
 * into the caller's buffer of exactly its size (None skips a field), as the
 * DataLoader ring does into its shared slots; layouts[i] is (dtype, shape) of
 * field i as read. A size mismatch is a WireheadValueError naming the field. */
static PyObject *wh__store_read_sample_into(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"gen", "pos", "buffers", "timeout", "skip", NULL};
    unsigned long long gen;
    unsigned int pos;
    PyObject *bufs;
    double timeout = 60.0;
    int skip = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KIO|dp", kwlist, &gen, &pos, &bufs, &timeout,
                                     &skip))
        return NULL;
    wh_read_at_t at = {0};
    at.gen = gen;
    at.pos = pos;
    at.strict = !skip;
    PyObject *lay = wh__read_bufs(self, gen, pos, bufs, &at, timeout);
    if (!lay) return NULL;
    return Py_BuildValue("KIONs", (unsigned long long)at.gen, at.pos, at.pad ? Py_True : Py_False,
                         lay, at.corrupt ? at.last_skip : NULL);
}

static PyObject *wh__status_dict(const wh_status_t *s) {
    PyObject *hist = PyList_New(s->nhistory);
    for (int i = 0; hist && i < s->nhistory; i++)
        wh__list_put(&hist, i,
                     Py_BuildValue("{sKsdsKsKsd}", "generation",
                                   (unsigned long long)s->history[i].generation, "time",
                                   (double)s->history[i].time_ns / 1e9, "generated",
                                   (unsigned long long)s->history[i].generated, "discarded",
                                   (unsigned long long)s->history[i].discarded, "seal_s",
                                   (double)s->history[i].seal_ns / 1e9));
    if (!hist) return NULL;
    PyObject *areas = PyList_New(s->nareas);
    for (int i = 0; areas && i < s->nareas; i++)
        wh__list_put(&areas, i,
                     Py_BuildValue("{sKsIsIsL}", "generation",
                                   (unsigned long long)s->areas[i].generation, "pins",
                                   s->areas[i].pins, "pinners", s->areas[i].pinners, "pin_pid",
                                   (long long)s->areas[i].pin_pid));
    PyObject *readers = areas ? PyList_New(s->nreaders) : NULL;
    for (int i = 0; readers && i < s->nreaders; i++) {
        const typeof(s->readers[0]) *r = &s->readers[i];
        double cap = s->swap_cap ? (double)s->swap_cap : 1.0;
        wh__list_put(&readers, i,
                     Py_BuildValue("{sKsssKsKsKsdsdsdsd}", "pid", (unsigned long long)r->pid,
                                   "host", r->host, "generation", (unsigned long long)r->generation,
                                   "reads", (unsigned long long)r->reads, "gen_reads",
                                   (unsigned long long)r->gen_reads, "reuse",
                                   (double)r->gen_reads / cap, "samples_per_s",
                                   r->up_s > 0 ? (double)r->reads / r->up_s : 0.0, "up_s", r->up_s,
                                   "age_s", r->age_s));
    }
    if (!readers) {
        Py_XDECREF(areas);
        Py_DECREF(hist);
        return NULL;
    }
    return Py_BuildValue(
        "{sKsKsIsIsKsKsKsKsKsKsKsKsdsNsNsN}", "read_gen", (unsigned long long)s->read_gen,
        "write_gen", (unsigned long long)s->write_gen, "write_fill", s->write_fill, "swap_cap",
        s->swap_cap, "write_bytes", (unsigned long long)s->write_bytes, "byte_budget",
        (unsigned long long)s->byte_budget, "store_bytes", (unsigned long long)s->store_bytes,
        "creator_pid", (unsigned long long)s->creator_pid, "generated",
        (unsigned long long)s->generated, "discarded", (unsigned long long)s->discarded, "seals",
        (unsigned long long)s->seals, "leader_pid", (unsigned long long)s->leader_pid,
        "lease_left_s", s->lease_left_s, "history", hist, "areas", areas, "readers", readers);
}

static PyObject *wh__store_status(wh__pystore_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    wh_status_t s;
    bool ok;
    WH__CALL(self, st, ok, &err, wh_store_status(self->st, &s, &err));
    if (!ok) return wh__raise(S, &err);
    return wh__status_dict(&s);
}

static PyObject *wh__store_get_swap_cap(wh__pystore_t *self, void *c) {
    (void)c;
    if (!wh__open(self)) return NULL;
    return PyLong_FromUnsignedLong(self->swap_cap);
}

static PyMethodDef wh__store_methods[] = {
    {"put", (PyCFunction)(void (*)(void))wh__store_put, METH_VARARGS | METH_KEYWORDS,
     "put(arrays, wait_ms=100) -> (status, generation)"},
    {"lead", (PyCFunction)wh__store_lead, METH_NOARGS, "acquire or renew the manager lease"},
    {"resign", (PyCFunction)wh__store_resign, METH_NOARGS, "give the manager lease up"},
    {"seal", (PyCFunction)wh__store_seal, METH_NOARGS,
     "seal if full: info dict; {'blocked_pid': P} while a live writer holds the next area; else "
     "None"},
    {"current", (PyCFunction)wh__store_current, METH_NOARGS, "read generation (0: none)"},
    {"read", (PyCFunction)(void (*)(void))wh__store_read, METH_VARARGS | METH_KEYWORDS,
     "read(gen, pos, want=None) -> list of Array"},
    {"read_sample", (PyCFunction)(void (*)(void))wh__store_read_sample,
     METH_VARARGS | METH_KEYWORDS,
     "read_sample(gen, pos, want=None, timeout=60.0, skip=True) -> (gen, pos, is_pad, arrays, "
     "skipped)"},
    {"view_sample", (PyCFunction)(void (*)(void))wh__store_view_sample,
     METH_VARARGS | METH_KEYWORDS,
     "view_sample(gen, pos, want=None, timeout=60.0, skip=True): read_sample's result with "
     "arrays viewing the store (shm:// only; read-only; the generation stays pinned while any "
     "of them lives)"},
    {"wait_generation", (PyCFunction)(void (*)(void))wh__store_wait_generation,
     METH_VARARGS | METH_KEYWORDS,
     "wait_generation(newer_than=0, timeout=60.0) -> newest read generation"},
    {"read_into", (PyCFunction)wh__store_read_into, METH_VARARGS,
     "read_into(gen, pos, buffers): copy each field into a caller buffer of its size"},
    {"read_sample_into", (PyCFunction)(void (*)(void))wh__store_read_sample_into,
     METH_VARARGS | METH_KEYWORDS,
     "read_sample_into(gen, pos, buffers, timeout=60.0, skip=True) -> (gen, pos, is_pad, layouts, "
     "skipped)"},
    {"status", (PyCFunction)wh__store_status, METH_NOARGS, "figures as a dict"},
    {"close", (PyCFunction)wh__store_close, METH_NOARGS, "release the handle"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wh__store_getset[] = {
    {"swap_cap", (getter)wh__store_get_swap_cap, NULL, "SWAP_CAP", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot wh__store_slots[] = {
    {Py_tp_init, wh__store_init},
    {Py_tp_dealloc, wh__store_dealloc},
    {Py_tp_methods, wh__store_methods},
    {Py_tp_getset, wh__store_getset},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "A handle on a wirehead store (one per process; open after fork)."},
    {0, NULL},
};

static PyType_Spec wh__store_spec = {
    "wirehead_torch._C.Store", sizeof(wh__pystore_t), 0, Py_TPFLAGS_DEFAULT, wh__store_slots,
};

/* ---- CUDA (wh_cuda.c): the runtime probe and the GPU stage ---- */

static PyObject *wh__cuda_init_py(PyObject *mod, PyObject *args) {
    wh__state_t *S = wh__mstate(mod);
    int device = 0;
    if (!PyArg_ParseTuple(args, "|i", &device)) return NULL;
    wh_err_t err = {0};
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_cuda_init(device, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh__raise(S, &err);
    return Py_BuildValue("{sssi}", "lib", wh_cuda_lib_name(), "runtime_version",
                         wh_cuda_runtime_version());
}

static int wh__gpu_stats_into(PyObject *d, wh_gpu_t *g) {
    wh_gpu_stats_t st;
    Py_BEGIN_ALLOW_THREADS wh_gpu_stats(g, &st);
    Py_END_ALLOW_THREADS PyObject *x = Py_BuildValue(
        "{sKsKsdsKsdsKsIsIsK}", "copies", (unsigned long long)st.copies, "h2d_bytes",
        (unsigned long long)st.h2d_bytes, "copy_s", (double)st.copy_ns / 1e9, "host_waits",
        (unsigned long long)st.host_waits, "host_wait_s", (double)st.host_wait_ns / 1e9,
        "stream_waits", (unsigned long long)st.stream_waits, "device_buffers", st.device_bufs,
        "pinned_buffers", st.pinned_bufs, "device_bytes", (unsigned long long)st.device_bytes);
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
    wh__state_t *S = wh__tstate(self);
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
        wh__raise(S, &err);
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
    wh__state_t *S = wh__tstate(self);
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
    for (Py_ssize_t i = 0; i < k; i++) memcpy((char *)h->data + it[i].off, it[i].src, it[i].n);
    *dev = wh_gpu_copy(g, h, total, err);
    wh_buf_unref(h); /* the stage holds it until the copy's event */
    return *dev != NULL;
}

/* copy([(data_ptr, nbytes, dtype, shape), ...]): the host bytes (C order,
 * alive for the call) through one page-locked buffer and one async copy;
 * returns device Arrays. */
static PyObject *wh__stage_copy(wh__pystage_t *self, PyObject *items) {
    wh__state_t *S = wh__tstate(self);
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
        wh__raise(S, &err);
        goto out;
    }
    res = PyList_New(k);
    for (Py_ssize_t i = 0; res && i < k; i++) {
        wh__list_put(&res, i,
                     wh_array_new(S->array, dev, it[i].off, it[i].dtype, it[i].ndim, it[i].shape));
    }
    wh_buf_unref(dev);
out:
    PyMem_Free(it);
    Py_DECREF(seq);
    return res;
}

static PyObject *wh__stage_stats(wh__pystage_t *self, PyObject *unused) {
    (void)unused;
    if (!wh__stage_ok(self)) return NULL;
    PyObject *d = PyDict_New();
    if (d && wh__gpu_stats_into(d, self->g) < 0) Py_CLEAR(d);
    return d;
}

static PyObject *wh__stage_close(wh__pystage_t *self, PyObject *unused) {
    (void)unused;
    wh__stage_close_g(self);
    Py_RETURN_NONE;
}

static PyMethodDef wh__stage_methods[] = {
    {"copy", (PyCFunction)wh__stage_copy, METH_O,
     "copy([(ptr, nbytes, dtype, shape), ...]) -> device Arrays (pinned ring, async copy)"},
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

static int wh__add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *bases,
                       const char *doc);
static int wh__add_type(PyObject *m, PyTypeObject **slot, PyType_Spec *spec);

static int wh__cuda_exec(PyObject *m, wh__state_t *S) {
    PyObject *b = PyTuple_Pack(2, S->base, PyExc_RuntimeError);
    int r =
        b ? wh__add_exc(m, &S->cuda, "CudaError", b, "The CUDA runtime is missing or failed.") : -1;
    Py_XDECREF(b);
    if (r < 0 || wh__add_type(m, &S->stage, &wh__stage_spec) < 0) return -1;
    return PyModule_AddFunctions(m, wh__cuda_methods);
}

/* ---- Loader ---- */

typedef struct {
    PyObject_HEAD wh_loader_t *ld;
    pthread_mutex_t mu;
    long pid;
    uint32_t want;
    int nfields;
    bool inited;
    wh_gpu_t *gpu;       /* device=N: the GPU stage, */
    wh_gpu_feed_t *feed; /* and batches copied ahead */
} wh__pyloader_t;

/* device=N: batch memory is page-locked and a GPU stage copies it. */
static void wh__loader_gpu_new(wh__pyloader_t *self, wh_loader_config_t *lc, int device,
                               wh_err_t *err) {
    self->gpu = wh_gpu_new(device, err);
    if (!self->gpu) return;
    lc->alloc.alloc = wh_cuda_host_alloc;
    lc->alloc.free = wh_cuda_host_free;
    lc->alloc.ctx = (void *)(intptr_t)device;
}

static int wh__loader_init(wh__pyloader_t *self, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__tstate(self);
    static char *kwlist[] = {"store",   "batch",     "threads", "prefetch", "drop_last",   "world",
                             "rank",    "shuffle",   "seed",    "pad",      "pad_batches", "want",
                             "refresh", "timeout_s", "device",  NULL};
    PyObject *store, *want;
    unsigned int batch, threads, prefetch, world, rank;
    int drop_last, shuffle, pad, pad_batches, refresh;
    unsigned long long seed;
    double timeout_s;
    int device = -1;
    if (self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "Loader already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!IIIpIIpKipOid|i", kwlist, &PyDict_Type, &store,
                                     &batch, &threads, &prefetch, &drop_last, &world, &rank,
                                     &shuffle, &seed, &pad, &pad_batches, &want, &refresh,
                                     &timeout_s, &device))
        return -1;
    if (!(timeout_s > 0 && timeout_s < 1e6)) {
        PyErr_SetString(S->value, "READ_TIMEOUT must be a positive number of seconds below "
                                  "10^6");
        return -1;
    }
    PyObject *empty = PyTuple_New(0);
    if (!empty) return -1;
    wh__cfgbuf_t cb;
    bool parsed = wh__parse_cfg(S, empty, store, &cb);
    Py_DECREF(empty);
    if (!parsed) return -1;
    wh_loader_config_t lc;
    memset(&lc, 0, sizeof lc);
    lc.store = cb.cfg;
    lc.plan.swap_cap = cb.cfg.swap_cap;
    lc.plan.world = world;
    lc.plan.rank = rank;
    lc.plan.batch = pad_batches ? batch : 0;
    lc.plan.shuffle = shuffle;
    lc.plan.seed = seed;
    lc.plan.pad = pad;
    lc.plan.drop_last = drop_last;
    lc.batch = batch;
    lc.threads = threads;
    lc.prefetch = prefetch;
    lc.drop_last = drop_last;
    lc.refresh = refresh;
    lc.timeout_s = timeout_s;
    PyObject *seq = PySequence_Fast(want, "want must be a sequence of field indices");
    if (!seq) {
        Py_DECREF(cb.keep);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (k < 0 || k >= cb.cfg.schema.nfields) {
            if (!PyErr_Occurred()) PyErr_Format(S->value, "field index %ld out of range", k);
            Py_DECREF(seq);
            Py_DECREF(cb.keep);
            return -1;
        }
        lc.want |= 1u << k;
    }
    Py_DECREF(seq);
    wh_err_t err = {0};
    wh_loader_t *ld = NULL;
    Py_BEGIN_ALLOW_THREADS if (device >= 0) wh__loader_gpu_new(self, &lc, device, &err);
    if (device < 0 || self->gpu) ld = wh_loader_new(&lc, &err);
    if (ld && self->gpu && !(self->feed = wh_gpu_feed_new(self->gpu, ld, prefetch, &err))) {
        wh_loader_destroy(ld);
        ld = NULL;
    }
    if (!ld) {
        wh_gpu_destroy(self->gpu);
        self->gpu = NULL;
    }
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!ld) {
        wh__raise(S, &err);
        return -1;
    }
    pthread_mutex_init(&self->mu, NULL);
    self->ld = ld;
    self->inited = true;
    self->pid = (long)getpid();
    self->want = lc.want;
    self->nfields = cb.cfg.schema.nfields;
    return 0;
}

static void wh__loader_close_ld(wh__pyloader_t *self) {
    if (!self->inited) return;
    if ((long)getpid() != self->pid) { /* threads did not cross the fork */
        self->ld = NULL;
        self->feed = NULL;
        self->gpu = NULL;
        return;
    }
    wh_loader_t *ld;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu); /* waits for a call in another thread */
    ld = self->ld;
    self->ld = NULL;
    pthread_mutex_unlock(&self->mu);
    wh_gpu_feed_destroy(self->feed);
    wh_gpu_destroy(self->gpu);
    self->feed = NULL;
    self->gpu = NULL;
    wh_loader_destroy(ld);
    Py_END_ALLOW_THREADS
}

static void wh__loader_dealloc(wh__pyloader_t *self) {
    PyTypeObject *tp = Py_TYPE(self);
    wh__loader_close_ld(self);
    if (self->inited) pthread_mutex_destroy(&self->mu);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static bool wh__loader_ok(wh__pyloader_t *self) {
    wh__state_t *S = wh__tstate(self);
    if (!self->ld) {
        PyErr_SetString(S->value, "loader is closed");
        return false;
    }
    if ((long)getpid() != self->pid) {
        PyErr_SetString(S->value, "a WireheadLoader cannot be used after fork; make it "
                                  "in the process that iterates");
        return false;
    }
    return true;
}

static PyObject *wh__loader_start(wh__pyloader_t *self, PyObject *args) {
    wh__state_t *S = wh__tstate(self);
    unsigned long long epoch, start, gen;
    if (!PyArg_ParseTuple(args, "KKK", &epoch, &start, &gen) || !wh__loader_ok(self)) return NULL;
    wh_err_t err = {0};
    bool ok;
    WH__CALL(self, ld, ok, &err,
             (self->feed ? wh_gpu_feed_reset(self->feed) : (void)0,
              wh_loader_start(self->ld, epoch, start, gen, &err)));
    if (!ok) return wh__raise(S, &err);
    Py_RETURN_NONE;
}

static PyObject *wh__loader_next(wh__pyloader_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__loader_ok(self)) return NULL;
    wh_batch_t b;
    bool ok, done, any_pad = false;
    wh_err_t err = {0};
    for (;;) {
        WH__CALL(self, ld, ok, &err,
                 self->feed ? wh_gpu_feed_next(self->feed, 100, &b, &done, &any_pad, &err)
                            : wh_loader_next(self->ld, 100, &b, &done, &err));
        if (!ok) return wh__raise(S, &err);
        if (done) Py_RETURN_NONE;
        if (b.buf) break;
        if (PyErr_CheckSignals() < 0) return NULL; /* Ctrl-C while waiting */
    }
    PyObject *fields = PyList_New(self->nfields), *res = NULL;
    for (int f = 0; fields && f < self->nfields; f++) {
        PyObject *a = Py_None;
        if (self->want & (1u << f)) {
            int64_t shape[WH_MAX_NDIM + 1];
            shape[0] = b.n;
            for (int d = 0; d < b.meta[f].ndim; d++) shape[d + 1] = b.meta[f].shape[d];
            a = wh_array_new(S->array, b.buf, b.off[f], b.meta[f].dtype, b.meta[f].ndim + 1, shape);
        } else {
            Py_INCREF(a);
        }
        wh__list_put(&fields, f, a);
    }
    int64_t n = b.n;
    PyObject *pad = fields ? wh_array_new(S->array, b.buf, b.pad_off, WH_DT_BOOL, 1, &n) : NULL;
    PyObject *gen = pad ? wh_array_new(S->array, b.buf, b.gen_off, WH_DT_I64, 1, &n) : NULL;
    PyObject *pos = gen ? wh_array_new(S->array, b.buf, b.pos_off, WH_DT_I64, 1, &n) : NULL;
    if (pos && self->feed) /* device batches: whether padding is in, known on the host */
        res = Py_BuildValue("(NNNNKO)", fields, pad, gen, pos, (unsigned long long)b.index,
                            any_pad ? Py_True : Py_False);
    else if (pos)
        res = Py_BuildValue("(NNNNK)", fields, pad, gen, pos, (unsigned long long)b.index);
    if (!res) {
        Py_XDECREF(fields);
        Py_XDECREF(pad);
        Py_XDECREF(gen);
        Py_XDECREF(pos);
    }
    wh_buf_unref(b.buf); /* arrays hold their own references now */
    return res;
}

static bool wh__loader_stats_locked(wh_loader_t *ld, wh_loader_stats_t *st, uint64_t *sizes) {
    wh_loader_stats(ld, st);
    sizes[0] = wh_loader_batches(ld);
    sizes[1] = wh_loader_items(ld);
    sizes[2] = wh_loader_generation(ld);
    return true;
}

static PyObject *wh__loader_info(wh__pyloader_t *self, PyObject *unused) {
    wh__state_t *S = wh__tstate(self);
    (void)unused;
    if (!wh__loader_ok(self)) return NULL;
    wh_loader_stats_t st;
    memset(&st, 0, sizeof st);
    uint64_t sz[3] = {0, 0, 0};
    wh_err_t err = {0};
    bool ok;
    WH__CALL(self, ld, ok, &err, wh__loader_stats_locked(self->ld, &st, sz));
    if (!ok) return wh__raise(S, &err);
    PyObject *d = Py_BuildValue(
        "{sKsKsKsKsKsKsdsIsKss}", "batches_per_epoch", (unsigned long long)sz[0], "items_per_epoch",
        (unsigned long long)sz[1], "batches", (unsigned long long)st.batches, "items",
        (unsigned long long)st.items, "corrupt", (unsigned long long)st.corrupt, "gone",
        (unsigned long long)st.gone, "wait_s", (double)st.wait_ns / 1e9, "ring", st.ring,
        "generation", (unsigned long long)sz[2], "last_skip", st.last_skip);
    if (d && self->gpu && wh__gpu_stats_into(d, self->gpu) < 0) Py_CLEAR(d);
    return d;
}

static PyObject *wh__loader_close(wh__pyloader_t *self, PyObject *unused) {
    (void)unused;
    wh__loader_close_ld(self);
    Py_RETURN_NONE;
}

static PyMethodDef wh__loader_methods[] = {
    {"start", (PyCFunction)wh__loader_start, METH_VARARGS,
     "start(epoch, start_batch, generation): begin an epoch (generation 0: newest)"},
    {"next", (PyCFunction)wh__loader_next, METH_NOARGS,
     "next batch: (fields, is_pad, generation, position, index), or None at the epoch's end"},
    {"info", (PyCFunction)wh__loader_info, METH_NOARGS, "sizes and counters"},
    {"close", (PyCFunction)wh__loader_close, METH_NOARGS, "stop the reader threads"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot wh__loader_slots[] = {
    {Py_tp_init, wh__loader_init},
    {Py_tp_dealloc, wh__loader_dealloc},
    {Py_tp_methods, wh__loader_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "C batch reader (threads, ring of batch buffers)."},
    {0, NULL},
};

static PyType_Spec wh__loader_spec = {
    "wirehead_torch._C.Loader", sizeof(wh__pyloader_t), 0, Py_TPFLAGS_DEFAULT, wh__loader_slots,
};

/* ---- sample order (wh_plan) ---- */

/* The plan's keywords (drop_last optional), then up to 3 optional integers
 * named by extra (NULL-terminated; the plan functions each take their own). */
static bool wh__parse_plan(wh__state_t *S, PyObject *args, PyObject *kw, wh_plan_t *p,
                           const char *const *extra, unsigned long long *a, unsigned long long *b,
                           unsigned long long *c) {
    char *kwlist[14] = {"swap_cap", "world", "rank",      "workers", "worker", "batch", "shuffle",
                        "seed",     "pad",   "drop_last", NULL,      NULL,     NULL,    NULL};
    char fmt[16] = "IIIIIIpKi|p";
    for (int i = 0; extra && extra[i] && i < 3; i++) {
        kwlist[10 + i] = (char *)extra[i];
        strcat(fmt, "K");
    }
    int shuffle = 0, drop_last = 0;
    memset(p, 0, sizeof *p);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &p->swap_cap, &p->world, &p->rank,
                                     &p->workers, &p->worker, &p->batch, &shuffle, &p->seed,
                                     &p->pad, &drop_last, a, b, c))
        return false;
    p->shuffle = shuffle;
    p->drop_last = drop_last;
    wh_err_t err = {0};
    if (!wh_plan_check(p, &err)) {
        wh__raise(S, &err);
        return false;
    }
    return true;
}

/* plan_info(plan...) -> dict of steps, rank_items, rank_batches, rank_pads. */
static PyObject *wh__plan_info(PyObject *m, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__mstate(m);
    wh_plan_t p;
    if (!wh__parse_plan(S, args, kw, &p, NULL, NULL, NULL, NULL)) return NULL;
    return Py_BuildValue("{sKsKsKsK}", "steps", (unsigned long long)wh_plan_steps(&p), "rank_items",
                         (unsigned long long)wh_plan_rank_items(&p), "rank_batches",
                         (unsigned long long)(p.batch ? wh_plan_rank_batches(&p) : 0), "rank_pads",
                         (unsigned long long)wh_plan_rank_pads(&p));
}

/* plan_items(plan..., epoch=0, start=0, stop=all) -> (positions bytes int64, is_pad bytes uint8). */
static PyObject *wh__plan_items(PyObject *m, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__mstate(m);
    wh_plan_t p;
    static const char *const names[] = {"epoch", "start", "stop", NULL};
    unsigned long long epoch = 0, start = 0, stop = UINT64_MAX;
    if (!wh__parse_plan(S, args, kw, &p, names, &epoch, &start, &stop)) return NULL;
    uint64_t steps = wh_plan_steps(&p);
    if (stop > steps) stop = steps;
    if (start > stop) start = stop;
    Py_ssize_t n = (Py_ssize_t)(stop - start);
    PyObject *pos = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *pad = PyBytes_FromStringAndSize(NULL, n);
    if (!pos || !pad) {
        Py_XDECREF(pos);
        Py_XDECREF(pad);
        return NULL;
    }
    int64_t *po = (int64_t *)PyBytes_AS_STRING(pos);
    char *pa = PyBytes_AS_STRING(pad);
    wh_plan_perm_t perm;
    wh_plan_perm_init(&perm, p.swap_cap, p.seed, epoch, p.shuffle);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t q;
        bool isp;
        wh_plan_item_at(&p, &perm, start + (uint64_t)i, &q, &isp);
        po[i] = q;
        pa[i] = isp;
    }
    return Py_BuildValue("(NN)", pos, pad);
}

/* plan_resume(plan..., consumed=batches) -> (role, step): the plan worker
 * this DataLoader worker plays for the rest of the epoch and its first step. */
static PyObject *wh__plan_resume(PyObject *m, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__mstate(m);
    wh_plan_t p;
    static const char *const names[] = {"consumed", NULL};
    unsigned long long consumed = 0;
    if (!wh__parse_plan(S, args, kw, &p, names, &consumed, NULL, NULL)) return NULL;
    uint32_t role;
    uint64_t step;
    wh_plan_resume(&p, consumed, &role, &step);
    return Py_BuildValue("(IK)", (unsigned int)role, (unsigned long long)step);
}

/* ---- module functions ---- */

static PyObject *wh__clean(PyObject *m, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__mstate(m);
    wh__cfgbuf_t cb;
    if (!wh__parse_cfg(S, args, kw, &cb)) return NULL;
    wh_err_t err = {0};
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_store_clean(&cb.cfg, &err);
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!ok) return wh__raise(S, &err);
    Py_RETURN_NONE;
}

/* mongo_collections(uri, ...): the names of the collections in a MongoDB
 * store's database, whoever made them. */
static PyObject *wh__mongo_collections(PyObject *m, PyObject *args, PyObject *kw) {
    wh__state_t *S = wh__mstate(m);
    wh__cfgbuf_t cb;
    if (!wh__parse_cfg(S, args, kw, &cb)) return NULL;
    wh_err_t err = {0};
    char **names = NULL;
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_store_collections(&cb.cfg, &names, &err);
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!ok) return wh__raise(S, &err);
    PyObject *list = PyList_New(0);
    for (char **p = names; list && *p; p++) {
        PyObject *s = PyUnicode_DecodeUTF8(*p, (Py_ssize_t)strlen(*p), "replace");
        if (!s || PyList_Append(list, s) < 0) Py_CLEAR(list);
        Py_XDECREF(s);
    }
    wh_store_names_free(names);
    return list;
}

static PyObject *wh__counters(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_counters_t c;
    wh_counters_get(&c);
    uint64_t hits, misses, idle;
    wh_pool_stats(&hits, &misses, &idle);
    return Py_BuildValue(
        "{sKsKsKsKsKsK}", "bytes_copied_out", (unsigned long long)c.bytes_copied_out,
        "bytes_copied_in", (unsigned long long)c.bytes_copied_in, "copies_out",
        (unsigned long long)c.copies_out, "pool_hits", (unsigned long long)hits, "pool_misses",
        (unsigned long long)misses, "pool_idle_bytes", (unsigned long long)idle);
}

/* shm_layout() -> byte offsets inside an shm segment (tests that forge
 * damage) and the header's size (what a store reserves in /dev/shm). */
static PyObject *wh__shm_layout(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_shm_layout_t l;
    wh_shm_layout(&l);
    return Py_BuildValue("{snsnsnsnsnsnsnsnsnsnsnsnsnsn}", "hdr_lock", (Py_ssize_t)l.hdr_lock,
                         "leader_pid", (Py_ssize_t)l.leader_pid, "leader_token",
                         (Py_ssize_t)l.leader_token, "lease_expiry_ns",
                         (Py_ssize_t)l.lease_expiry_ns, "lease_ns", (Py_ssize_t)l.lease_ns, "slots",
                         (Py_ssize_t)l.slots, "slot_size", (Py_ssize_t)l.slot_size, "slot_lock",
                         (Py_ssize_t)l.slot_lock, "slot_gen", (Py_ssize_t)l.slot_gen, "slot_used",
                         (Py_ssize_t)l.slot_used, "slot_count", (Py_ssize_t)l.slot_count,
                         "slot_nholes", (Py_ssize_t)l.slot_nholes, "slot_holes",
                         (Py_ssize_t)l.slot_holes, "hdr_size", (Py_ssize_t)l.hdr_size);
}

static PyObject *wh__counters_reset(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_counters_reset();
    Py_RETURN_NONE;
}

/* ---- SharedMap: a mapped ring file with atomic control words ---- */

typedef struct {
    PyObject_HEAD wh_map_t
        map; /* a buffer on it holds a reference: unmapped only when all are gone */
} wh__map_obj;

/* SharedMap errors: BlockingIOError for a region another process holds,
 * OSError naming the file otherwise. */
static void wh__map_raise(const wh_err_t *err, bool busy) {
    if (busy) {
        PyObject *a = Py_BuildValue("(is)", EWOULDBLOCK, err->message);
        if (a) PyErr_SetObject(PyExc_BlockingIOError, a);
        Py_XDECREF(a);
    } else {
        PyErr_SetString(PyExc_OSError, err->message);
    }
}

static int wh__map_init(wh__map_obj *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "size", "how", "populate", "hugepage", NULL};
    const char *path, *how_s = "open";
    int populate = 0, hugepage = 0, how;
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sn|spp", kwlist, &path, &size, &how_s, &populate,
                                     &hugepage))
        return -1;
    if (self->map.base) {
        PyErr_SetString(PyExc_RuntimeError, "SharedMap: already mapped");
        return -1;
    }
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError, "SharedMap: size must be > 0, got %zd", size);
        return -1;
    }
    if (!strcmp(how_s, "open"))
        how = WH_MAP_OPEN;
    else if (!strcmp(how_s, "create"))
        how = WH_MAP_CREATE;
    else if (!strcmp(how_s, "region"))
        how = WH_MAP_REGION;
    else {
        PyErr_Format(PyExc_ValueError,
                     "SharedMap: how must be 'open', 'create' or 'region', "
                     "got '%s'",
                     how_s);
        return -1;
    }
    wh_err_t err = {0};
    bool ok, busy = false;
    Py_BEGIN_ALLOW_THREADS ok =
        wh_map_file(&self->map, path, (size_t)size, how, populate, hugepage, &busy, &err);
    Py_END_ALLOW_THREADS if (!ok) {
        wh__map_raise(&err, busy);
        return -1;
    }
    return 0;
}

static void wh__map_dealloc(wh__map_obj *self) {
    PyTypeObject *tp = Py_TYPE(self);
    wh_map_close(&self->map);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int wh__map_getbuffer(wh__map_obj *self, Py_buffer *view, int flags) {
    if (!self->map.base) {
        PyErr_SetString(PyExc_ValueError, "SharedMap: not mapped");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, self->map.base, (Py_ssize_t)self->map.size, 0,
                             flags);
}

/* Word index from a Python int, checked against the mapping's size; the
 * file is checked to hold the mapping first (no SIGBUS on a truncated one). */
static int wh__map_index(wh__map_obj *self, Py_ssize_t i, size_t *out) {
    wh_err_t err = {0};
    if (!wh_map_intact(&self->map, &err)) {
        wh__map_raise(&err, false);
        return -1;
    }
    if (i < 0 || (size_t)i >= self->map.size / 8) {
        PyErr_Format(PyExc_IndexError, "SharedMap: word %zd outside 0..%zu", i, self->map.size / 8);
        return -1;
    }
    *out = (size_t)i;
    return 0;
}

static PyObject *wh__map_load(wh__map_obj *self, PyObject *arg) {
    size_t i;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if ((n == -1 && PyErr_Occurred()) || wh__map_index(self, n, &i) < 0) return NULL;
    return PyLong_FromLongLong(wh_word_load(&self->map, i));
}

static PyObject *wh__map_store(wh__map_obj *self, PyObject *args) {
    Py_ssize_t n;
    long long v;
    size_t i;
    if (!PyArg_ParseTuple(args, "nL", &n, &v) || wh__map_index(self, n, &i) < 0) return NULL;
    wh_word_store(&self->map, i, v);
    Py_RETURN_NONE;
}

static PyObject *wh__map_cas(wh__map_obj *self, PyObject *args) {
    Py_ssize_t n;
    long long expect, desired;
    size_t i;
    if (!PyArg_ParseTuple(args, "nLL", &n, &expect, &desired) || wh__map_index(self, n, &i) < 0)
        return NULL;
    return PyBool_FromLong(wh_word_cas(&self->map, i, expect, desired));
}

static PyObject *wh__map_add(wh__map_obj *self, PyObject *args) {
    Py_ssize_t n;
    long long d;
    size_t i;
    if (!PyArg_ParseTuple(args, "nL", &n, &d) || wh__map_index(self, n, &i) < 0) return NULL;
    return PyLong_FromLongLong(wh_word_add(&self->map, i, d));
}

static PyObject *wh__map_check(wh__map_obj *self, PyObject *unused) {
    (void)unused;
    wh_err_t err = {0};
    if (!wh_map_intact(&self->map, &err)) return wh__map_raise(&err, false), NULL;
    Py_RETURN_NONE;
}

static PyObject *wh__map_hash(wh__map_obj *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) return PyErr_Format(PyExc_ValueError, "SharedMap.hash: n must be >= 0");
    wh_err_t err = {0};
    uint64_t h = 0;
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_map_hash(&self->map, (size_t)n, &h, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh__map_raise(&err, false), NULL;
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *wh__map_unlock(wh__map_obj *self, PyObject *unused) {
    (void)unused;
    wh_map_unlock(&self->map);
    Py_RETURN_NONE;
}

static PyObject *wh__map_path(wh__map_obj *self, void *closure) {
    (void)closure;
    return PyUnicode_DecodeFSDefault(self->map.path);
}

static PyObject *wh__map_size(wh__map_obj *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(self->map.size);
}

static PyMethodDef wh__map_methods[] = {
    {"load", (PyCFunction)wh__map_load, METH_O, "load(i): control word i"},
    {"store", (PyCFunction)wh__map_store, METH_VARARGS, "store(i, v): set control word i"},
    {"cas", (PyCFunction)wh__map_cas, METH_VARARGS,
     "cas(i, expect, new): set word i to new if it holds expect; True if it did"},
    {"add", (PyCFunction)wh__map_add, METH_VARARGS, "add(i, d): add d to word i, the new value"},
    {"check", (PyCFunction)wh__map_check, METH_NOARGS,
     "check(): OSError naming the file unless it still holds every mapped byte"},
    {"hash", (PyCFunction)wh__map_hash, METH_O, "hash(n): XXH3-64 of the first n bytes"},
    {"unlock", (PyCFunction)wh__map_unlock, METH_NOARGS, "unlock(): release a region's lock"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wh__map_getset[] = {
    {"size", (getter)wh__map_size, NULL, "bytes mapped", NULL},
    {"path", (getter)wh__map_path, NULL, "the file mapped", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot wh__map_slots[] = {
    {Py_tp_init, wh__map_init},
    {Py_tp_dealloc, wh__map_dealloc},
    {Py_tp_methods, wh__map_methods},
    {Py_tp_getset, wh__map_getset},
    {Py_bf_getbuffer, wh__map_getbuffer},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "SharedMap(path, size, how='open', populate=False, hugepage=False): a "
                "shared, writable mapping of a batch ring file (slots, control words). how: "
                "'open' an existing file, 'create' a new one (size bytes reserved), 'region' "
                "either, locked (BlockingIOError if another process holds it). A file that is "
                "a symlink, not ours or not mode 0600 is refused (OSError naming it); the "
                "size is re-checked before each word and hash. Unmapped when the last buffer "
                "on it is gone."},
    {0, NULL},
};

static PyType_Spec wh__map_spec = {
    "wirehead_torch._C.SharedMap", sizeof(wh__map_obj), 0, Py_TPFLAGS_DEFAULT, wh__map_slots,
};

/* ---- Xxh3: a streaming XXH3-64 (the shard files' checksums) ---- */

typedef struct {
    PyObject_HEAD XXH3_state_t *st;
    int busy; /* an update runs without the GIL: a second one on this object is refused */
} wh__hasher_obj;

static int wh__hasher_init(wh__hasher_obj *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist)) return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Xxh3 in use by another thread");
        return -1;
    }
    if (!self->st && !(self->st = XXH3_createState())) {
        PyErr_NoMemory();
        return -1;
    }
    XXH3_64bits_reset(self->st);
    return 0;
}

static void wh__hasher_dealloc(wh__hasher_obj *self) {
    PyTypeObject *tp = Py_TYPE(self);
    if (self->st) XXH3_freeState(self->st);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static bool wh__hasher_ready(wh__hasher_obj *self) {
    if (!self->st) {
        PyErr_SetString(PyExc_ValueError, "Xxh3 not initialised");
        return false;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Xxh3 in use by another thread");
        return false;
    }
    return true;
}

/* update(buffer): hashes any C-contiguous buffer, without the GIL when it
 * is large. */
static PyObject *wh__hasher_update(wh__hasher_obj *self, PyObject *obj) {
    if (!wh__hasher_ready(self)) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (v.len >= 65536) {
        self->busy = 1;
        Py_BEGIN_ALLOW_THREADS XXH3_64bits_update(self->st, v.buf, (size_t)v.len);
        Py_END_ALLOW_THREADS self->busy = 0;
    } else if (v.len > 0) {
        XXH3_64bits_update(self->st, v.buf, (size_t)v.len);
    }
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyObject *wh__hasher_hexdigest(wh__hasher_obj *self, PyObject *unused) {
    (void)unused;
    if (!wh__hasher_ready(self)) return NULL;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits_digest(self->st));
    return PyUnicode_FromString(hex);
}

static PyMethodDef wh__hasher_methods[] = {
    {"update", (PyCFunction)wh__hasher_update, METH_O, "update(buffer): hash these bytes next"},
    {"hexdigest", (PyCFunction)wh__hasher_hexdigest, METH_NOARGS,
     "XXH3-64 of the bytes so far, 16 hex digits"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot wh__hasher_slots[] = {
    {Py_tp_init, wh__hasher_init},
    {Py_tp_dealloc, wh__hasher_dealloc},
    {Py_tp_methods, wh__hasher_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "Xxh3(): a streaming XXH3-64 (seed 0) of the bytes given to update()."},
    {0, NULL},
};

static PyType_Spec wh__hasher_spec = {
    "wirehead_torch._C.Xxh3", sizeof(wh__hasher_obj), 0, Py_TPFLAGS_DEFAULT, wh__hasher_slots,
};

static PyMethodDef wh__module_methods[] = {
    {"clean", (PyCFunction)(void (*)(void))wh__clean, METH_VARARGS | METH_KEYWORDS,
     "clean(uri, swap_cap, fields, ...): remove everything this store holds"},
    {"mongo_collections", (PyCFunction)(void (*)(void))wh__mongo_collections,
     METH_VARARGS | METH_KEYWORDS, "collection names of a mongodb:// store's database"},
    {"counters", wh__counters, METH_NOARGS, "process-wide copy counters"},
    {"plan_info", (PyCFunction)(void (*)(void))wh__plan_info, METH_VARARGS | METH_KEYWORDS,
     "steps per worker, items and batches per rank"},
    {"plan_items", (PyCFunction)(void (*)(void))wh__plan_items, METH_VARARGS | METH_KEYWORDS,
     "positions and padding flags of steps [start, stop) of an epoch"},
    {"plan_resume", (PyCFunction)(void (*)(void))wh__plan_resume, METH_VARARGS | METH_KEYWORDS,
     "(role, step) of this DataLoader worker after the rank consumed `consumed` batches"},
    {"counters_reset", wh__counters_reset, METH_NOARGS, "zero the copy counters"},
    {"shm_layout", wh__shm_layout, METH_NOARGS, "byte offsets inside an shm segment (for tests)"},
    {NULL, NULL, 0, NULL},
};

/* A new exception class kept in *slot (the state's reference) and added
 * to the module as name. */
static int wh__add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *bases,
                       const char *doc) {
    char full[128];
    snprintf(full, sizeof full, "wirehead_torch.%s", name);
    *slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    if (!*slot) return -1;
    Py_INCREF(*slot);
    if (PyModule_AddObject(m, name, *slot) < 0) {
        Py_DECREF(*slot);
        return -1;
    }
    return 0;
}

/* A heap type bound to module m, kept in *slot and added to m. */
static int wh__add_type(PyObject *m, PyTypeObject **slot, PyType_Spec *spec) {
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    return *slot ? PyModule_AddType(m, *slot) : -1;
}

static int wh__add_excs(PyObject *m, wh__state_t *S) {
    if (wh__add_exc(m, &S->base, "WireheadError", NULL, "Base of wirehead_torch errors."))
        return -1;
#define WH__SUB(slot, name, extra, doc)                                                            \
    do {                                                                                           \
        PyObject *b = (extra) ? PyTuple_Pack(2, S->base, (extra)) : PyTuple_Pack(1, S->base);      \
        int r = b ? wh__add_exc(m, &S->slot, name, b, doc) : -1;                                   \
        Py_XDECREF(b);                                                                             \
        if (r) return -1;                                                                          \
    } while (0)
    WH__SUB(value, "InvalidSampleError", PyExc_ValueError, "Bad input (sample, argument).");
    WH__SUB(schema, "SchemaMismatchError", PyExc_ValueError,
            "The store was made with another format, SAMPLE or SWAP_CAP.");
    WH__SUB(gone, "GenerationGoneError", NULL, "The generation was reclaimed during a read.");
    WH__SUB(corrupt, "CorruptSampleError", NULL, "Stored bytes failed validation.");
    WH__SUB(nospace, "StoreSpaceError", PyExc_OSError, "Not enough space to create the store.");
    WH__SUB(toobig, "SampleTooLargeError", PyExc_ValueError,
            "A sample does not fit the store's byte budget.");
    WH__SUB(timeout, "StoreTimeoutError", PyExc_TimeoutError, "A bounded wait ran out.");
    WH__SUB(unavail, "StoreUnavailableError", PyExc_ConnectionError,
            "The store's server cannot be reached.");
    WH__SUB(notfound, "NotFoundError", PyExc_LookupError, "No such generation or position.");
    {
        PyObject *b = PyTuple_Pack(1, S->notfound);
        int r = b ? wh__add_exc(m, &S->nostore, "StoreNotCreatedError", b,
                                "The shm store does not exist yet: with BYTE_BUDGET auto the "
                                "first generator's first sample creates it.")
                  : -1;
        Py_XDECREF(b);
        if (r) return -1;
    }
    WH__SUB(lease, "LeaseLostError", NULL, "This manager does not hold the manager lease.");
    WH__SUB(pinned, "PinLimitError", NULL,
            "A store-backed view would break the pin policy; read a copy instead.");
#undef WH__SUB
    return 0;
}

static int wh__exec(PyObject *m) {
    wh__state_t *S = wh__mstate(m);
    if (wh__add_type(m, &S->store, &wh__store_spec) < 0 ||
        wh__add_type(m, &S->loader, &wh__loader_spec) < 0 ||
        wh__add_type(m, &S->map, &wh__map_spec) < 0 ||
        wh__add_type(m, &S->hasher, &wh__hasher_spec) < 0 ||
        wh__add_type(m, &S->array, &wh__array_spec) < 0 || wh__add_excs(m, S) < 0 ||
        wh__cuda_exec(m, S) < 0)
        return -1;
#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION
    S->array->tp_new = NULL; /* Python 3.9 */
#endif
    PyObject *d = PyDict_New();
    for (int i = 1; d && i < WH_DT_MAX_; i++) {
        PyObject *v = PyLong_FromLong(i);
        if (!v || PyDict_SetItemString(d, wh_dtype_name(i), v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (!d) return -1;
    if (PyModule_AddObject(m, "DTYPES", d) < 0) {
        Py_DECREF(d);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "PUT_ACCEPTED", WH_PUT_ACCEPTED) ||
        PyModule_AddIntConstant(m, "PUT_DISCARDED", WH_PUT_DISCARDED) ||
        PyModule_AddIntConstant(m, "PUT_WAIT", WH_PUT_WAIT) ||
        PyModule_AddIntConstant(m, "FORMAT_VERSION", WH_FORMAT_VERSION) ||
        PyModule_AddIntConstant(m, "FAULT_HOOKS", WH_FAULTS_BUILT) ||
        PyModule_AddIntConstant(m, "MAX_FIELDS", WH_MAX_FIELDS) ||
        PyModule_AddIntConstant(m, "MAX_NDIM", WH_MAX_NDIM))
        return -1;
    return 0;
}

static int wh__traverse(PyObject *m, visitproc visit, void *arg) {
    wh__state_t *S = wh__mstate(m);
#define WH__VISIT(f) Py_VISIT(S->f);
    WH__STATE_FIELDS(WH__VISIT)
#undef WH__VISIT
    return 0;
}

static int wh__clear(PyObject *m) {
    wh__state_t *S = wh__mstate(m);
#define WH__CLEAR(f) Py_CLEAR(S->f);
    WH__STATE_FIELDS(WH__CLEAR)
#undef WH__CLEAR
    return 0;
}

static void wh__free(void *m) { wh__clear((PyObject *)m); }

static PyModuleDef_Slot wh__slots[] = {
    {Py_mod_exec, (void *)wh__exec},
    {0, NULL},
};

static struct PyModuleDef wh__module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "wirehead_torch._C",
    .m_doc = "wirehead_torch C core",
    .m_size = sizeof(wh__state_t),
    .m_methods = wh__module_methods,
    .m_slots = wh__slots,
    .m_traverse = wh__traverse,
    .m_clear = wh__clear,
    .m_free = wh__free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&wh__module); }
