/* wirehead_torch._C.Store: a handle on a store (wh_store.h), every call
 * made with the GIL released. Its configuration from keywords, the module
 * functions over a store's configuration and the records its results come
 * in: wh_py_store_fns.c. */
#include "wh_py.h"

#include <string.h>

#include "wh_dlpack.h"
#include "wh_relay.h"

/* ---- Store ---- */

typedef struct {
    PyObject_HEAD wh_store_t *st;
    pthread_mutex_t mu; /* one C call at a time per handle; lives until dealloc */
    bool inited;
    int nfields; /* copies, readable after close */
    uint32_t swap_cap;
} wh__pystore_t;

static int wh__store_init(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_cfgbuf_t cb;
    if (self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "Store already initialised");
        return -1;
    }
    if (!wh_py_parse_cfg(wh_py_tstate(self), args, kw, &cb)) return -1;
    wh_err_t err = {0};
    wh_store_t *st;
    Py_BEGIN_ALLOW_THREADS st = wh_store_open(&cb.cfg, &err);
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!st) {
        wh_py_raise(wh_py_tstate(self), &err);
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
    if (!self->st) PyErr_SetString(wh_py_tstate(self)->value, "store is closed");
    return self->st != NULL;
}

int wh_py_store_call(wh_py_state_t *S, PyObject *store,
                     bool (*fn)(wh_store_t *, void *, wh_err_t *), void *ctx, bool *ok,
                     wh_err_t *err) {
    if (!PyObject_TypeCheck(store, S->store)) {
        PyErr_Format(PyExc_TypeError, "expected a wirehead_torch._C.Store, got %s",
                     Py_TYPE(store)->tp_name);
        return -1;
    }
    wh__pystore_t *self = (wh__pystore_t *)store;
    if (!wh__open(self)) return -1;
    WH_PY_CALL(self, st, *ok, err, fn(self->st, ctx, err));
    return 0;
}

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

int wh_py_arrays_get(wh_py_state_t *S, PyObject *arrays, Py_buffer *views, wh_array_t *arr) {
    PyObject *seq = PySequence_Fast(arrays, "arrays must be a sequence");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > WH_MAX_FIELDS) {
        Py_DECREF(seq);
        PyErr_Format(S->value, "sample has %zd fields, at most %d", n, WH_MAX_FIELDS);
        return -1;
    }
    int got = 0;
    for (; got < n; got++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got), *obj;
        int code;
        if (!PyArg_ParseTuple(item, "Oi;each array must be (buffer, dtype_code)", &obj, &code))
            goto fail;
        size_t isz = wh_dtype_size(code);
        if (!isz) {
            PyErr_Format(S->value, "field %d: unknown dtype code %d", got, code);
            goto fail;
        }
        if (PyObject_GetBuffer(obj, &views[got], PyBUF_RECORDS_RO) < 0) goto fail;
        Py_buffer *v = &views[got];
        if ((size_t)v->itemsize != isz || v->ndim > WH_MAX_NDIM) {
            PyErr_Format(S->value, "field %d: itemsize %zd or ndim %d does not fit dtype %s", got,
                         v->itemsize, v->ndim, wh_dtype_name(code));
            PyBuffer_Release(v);
            goto fail;
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
    Py_DECREF(seq);
    return got;
fail:
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    Py_DECREF(seq);
    return -1;
}

/* put(arrays, wait_ms=100): arrays is a sequence of (buffer, dtype_code). */
static PyObject *wh__store_put(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"arrays", "wait_ms", NULL};
    PyObject *arrays;
    unsigned int wait_ms = 100;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|I", kwlist, &arrays, &wait_ms)) return NULL;
    if (!wh__open(self)) return NULL;
    Py_buffer views[WH_MAX_FIELDS];
    wh_array_t arr[WH_MAX_FIELDS];
    int n = wh_py_arrays_get(S, arrays, views, arr);
    if (n < 0) return NULL;
    wh_err_t err = {0};
    wh_put_status_t status = WH_PUT_WAIT;
    uint64_t gen = 0;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_put(self->st, arr, n, wait_ms, &status, &gen, &err));
    for (int i = 0; i < n; i++) PyBuffer_Release(&views[i]);
    return ok ? wh_py_record(S->rec_put, 2, PyLong_FromLong((long)status),
                             PyLong_FromUnsignedLongLong(gen))
              : wh_py_raise(S, &err);
}

static PyObject *wh__store_lead(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    bool ok, leader = false;
    WH_PY_CALL(self, st, ok, &err, wh_store_lead(self->st, &leader, &err));
    if (!ok) return wh_py_raise(S, &err);
    return PyBool_FromLong(leader);
}

static PyObject *wh__store_resign(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_resign(self->st, &err));
    if (!ok) return wh_py_raise(S, &err);
    Py_RETURN_NONE;
}

static PyObject *wh__store_seal(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    wh_seal_info_t info = {0};
    bool ok, sealed = false;
    WH_PY_CALL(self, st, ok, &err, wh_store_seal(self->st, &sealed, &info, &err));
    if (!ok) return wh_py_raise(S, &err);
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

/* pull_from(src, gen, budget=0, wait_s=30.0): this shm store mirrors sealed
 * generation gen of the mongodb store src (the relay; docs/relay.md). */
static PyObject *wh__store_pull_from(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kws[] = {"src", "gen", "budget", "wait_s", NULL};
    PyObject *srcobj;
    unsigned long long gen, budget = 0;
    double wait_s = 30.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!K|Kd", kws, S->store, &srcobj, &gen, &budget,
                                     &wait_s))
        return NULL;
    wh__pystore_t *src = (wh__pystore_t *)srcobj;
    if (!wh__open(self) || !wh__open(src)) return NULL;
    if (src == self) return PyErr_Format(S->value, "a store cannot mirror itself");
    wh_err_t err = {0};
    wh_relay_info_t info;
    bool ok;
    /* both handles held for the copy: dst's first (only the relay pairs them) */
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu);
    pthread_mutex_lock(&src->mu);
    if (self->st && src->st)
        ok = wh_relay_pull(src->st, self->st, gen, budget, wait_s, &info, &err);
    else
        ok = wh_err_set(&err, WH_E_INVALID, "the handle was closed");
    pthread_mutex_unlock(&src->mu);
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS if (!ok) return wh_py_raise(S, &err);
    return Py_BuildValue("{sKsIsKsd}", "generation", (unsigned long long)info.gen, "samples",
                         (unsigned)info.samples, "bytes", (unsigned long long)info.bytes, "pull_s",
                         (double)info.ns / 1e9);
}

static PyObject *wh__store_current(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    uint64_t gen = 0;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_current(self->st, &gen, &err));
    if (!ok) return wh_py_raise(S, &err);
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
static bool wh__want_mask(wh_py_state_t *S, int nf, PyObject *want, uint32_t *mask) {
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
static PyObject *wh__array_list(wh_py_state_t *S, int nf, wh_buf_t *const *bufs, bool in_sample,
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
        wh_py_list_put(&out, i, a);
    }
    return out;
}

/* read(gen, pos, want=None) -> list of Array (None for fields not wanted);
 * exactly that sample or an error, no retry. */
static PyObject *wh__store_read(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
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
    WH_PY_CALL(self, st, ok, &err,
               wh_store_read(self->st, gen, pos, wh__read_dest, &ctx, &meta, &err));
    PyObject *out =
        ok ? wh__array_list(S, self->nfields, ctx.bufs, false, &meta) : wh_py_raise(S, &err);
    for (int i = 0; i < WH_MAX_FIELDS; i++) wh_buf_unref(ctx.bufs[i]);
    return out;
}

/* Arguments (gen, pos, want=None, timeout=60.0, skip=True, spec_gen=None)
 * of read_sample and view_sample; spec_gen: spec mode's exact read of that
 * spec generation (gen 0: located first). */
static bool wh__parse_at(wh__pystore_t *self, PyObject *args, PyObject *kw, wh_read_at_t *at,
                         uint32_t *mask, double *timeout) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"gen", "pos", "want", "timeout", "skip", "spec_gen", NULL};
    unsigned long long gen;
    unsigned int pos;
    PyObject *want = Py_None, *spec_gen = Py_None;
    int skip = 1;
    *timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KI|Odp$O", kwlist, &gen, &pos, &want, timeout,
                                     &skip, &spec_gen) ||
        !wh__open(self) || !wh__want_mask(S, self->nfields, want, mask))
        return false;
    memset(at, 0, sizeof *at);
    at->gen = gen;
    at->pos = pos;
    at->strict = !skip;
    if (spec_gen != Py_None) {
        at->exact = true;
        at->spec_gen = PyLong_AsUnsignedLongLong(spec_gen);
        if (PyErr_Occurred()) return false;
    }
    return true;
}

/* The record (type: SampleRead or SampleCopy) of a policy read: where it
 * read, whether that is padding, items (its arrays or layouts; stolen) and
 * what it skipped. */
static PyObject *wh__at_result(PyTypeObject *type, const wh_read_at_t *at, PyObject *items) {
    if (!items) return NULL;
    return wh_py_record(type, 5, PyLong_FromUnsignedLongLong(at->gen),
                        PyLong_FromUnsignedLong(at->pos), PyBool_FromLong(at->pad), items,
                        wh_py_str_or_none(at->corrupt ? at->last_skip : NULL));
}

/* read_sample(gen, pos, want=None, timeout=60.0, skip=True) -> SampleRead
 * (generation, position, is_pad, arrays, skipped): the one read policy (wh_store_read_sample):
 * moves to the newest generation when gen (0: the newest) was reclaimed,
 * skips a corrupt sample for its neighbour (is_pad True, skipped says why)
 * or, with skip=False, raises CorruptSampleError. */
static PyObject *wh__store_read_sample(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    wh__readctx_t ctx = {0};
    wh_read_at_t at;
    double timeout;
    if (!wh__parse_at(self, args, kw, &at, &ctx.want, &timeout)) return NULL;
    wh_err_t err = {0};
    wh_sample_meta_t meta;
    bool ok;
    WH_PY_CALL(
        self, st, ok, &err,
        wh_store_read_sample(self->st, &at, timeout, NULL, wh__read_dest, &ctx, &meta, &err));
    PyObject *out = ok ? wh__at_result(S->rec_read, &at,
                                       wh__array_list(S, self->nfields, ctx.bufs, false, &meta))
                       : wh_py_raise(S, &err);
    for (int i = 0; i < WH_MAX_FIELDS; i++) wh_buf_unref(ctx.bufs[i]);
    return out;
}

/* wait_generation(newer_than=0, timeout=60.0) -> newest read generation
 * other than newer_than, waiting with the read policy's backoff. */
static PyObject *wh__store_wait_generation(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"newer_than", "timeout", NULL};
    unsigned long long newer = 0;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Kd", kwlist, &newer, &timeout)) return NULL;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    uint64_t gen = 0;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_wait_gen(self->st, newer, timeout, NULL, &gen, &err));
    if (!ok) return wh_py_raise(S, &err);
    return PyLong_FromUnsignedLongLong(gen);
}

/* view_sample(gen, pos, want=None, timeout=60.0, skip=True) -> as
 * read_sample, but the arrays view the store (read-only, pinned until the
 * last of them dies) instead of holding copies. A backend with views only (WH_CAP_VIEWS). */
static PyObject *wh__store_view_sample(wh__pystore_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    uint32_t mask;
    wh_read_at_t at;
    double timeout;
    if (!wh__parse_at(self, args, kw, &at, &mask, &timeout)) return NULL;
    wh_err_t err = {0};
    wh_sample_meta_t meta;
    wh_buf_t *v = NULL;
    bool ok;
    WH_PY_CALL(self, st, ok, &err,
               wh_store_view_sample(self->st, &at, timeout, NULL, &v, &meta, &err));
    if (!ok) return wh_py_raise(S, &err);
    wh_buf_t *bufs[WH_MAX_FIELDS] = {0};
    for (int i = 0; i < self->nfields; i++)
        if (mask & (1u << i)) bufs[i] = v; /* every Array holds the view, hence the pin */
    PyObject *out =
        wh__at_result(S->rec_read, &at, wh__array_list(S, self->nfields, bufs, true, &meta));
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
static bool wh__get_views(wh_py_state_t *S, PyObject *seq, Py_buffer *views, int *got) {
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

/* [FieldLayout(dtype name, shape tuple) or None] for the fields copied into views. */
static PyObject *wh__layouts(wh_py_state_t *S, const Py_buffer *views, int n,
                             const wh_sample_meta_t *meta) {
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *o = Py_None;
        if (views[i].buf && i < meta->nfields) {
            const wh_field_meta_t *f = &meta->f[i];
            PyObject *shape = wh_py_shape_tuple(f->ndim, f->shape);
            o = shape ? wh_py_record(S->rec_layout, 2,
                                     PyUnicode_FromString(wh_dtype_name(f->dtype)), shape)
                      : NULL;
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

/* The stored XXH3 of each field copied (the bytes now in the caller's
 * buffer, checked during the copy when reads are verified), None for a
 * field skipped: a list. */
static PyObject *wh__checksums(const Py_buffer *views, int n, const wh_sample_meta_t *meta) {
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *o = Py_None;
        if (views[i].buf && i < meta->nfields) {
            if (!(o = PyLong_FromUnsignedLongLong(meta->f[i].checksum))) {
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
                               wh_read_at_t *at, double timeout, PyObject **sums) {
    wh_py_state_t *S = wh_py_tstate(self);
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
            WH_PY_CALL(self, st, ok, &err,
                       wh_store_read_sample(self->st, at, timeout, NULL, wh__into_dest, &ctx, &meta,
                                            &err));
        else
            WH_PY_CALL(self, st, ok, &err,
                       wh_store_read(self->st, gen, pos, wh__into_dest, &ctx, &meta, &err));
        res = ok ? wh__layouts(S, views, got, &meta) : wh_py_raise(S, &err);
        if (res && sums && !(*sums = wh__checksums(views, got, &meta))) Py_CLEAR(res);
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
    PyObject *lay = wh__read_bufs(self, gen, pos, bufs, NULL, 0, NULL);
    if (!lay) return NULL;
    Py_DECREF(lay);
    Py_RETURN_NONE;
}

/* read_sample_into(gen, pos, buffers, timeout=60.0, skip=True) -> SampleCopy
 * (generation, position, is_pad, layouts, skipped, checksums): read_sample's policy, copying each field once
 * into the caller's buffer of exactly its size (None skips a field), as the
 * DataLoader ring does into its shared slots; layouts[i] is the FieldLayout
 * (dtype, shape) of field i as read. A size mismatch is a WireheadValueError naming the field. */
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
    PyObject *sums = NULL;
    PyObject *lay = wh__read_bufs(self, gen, pos, bufs, &at, timeout, &sums);
    if (!lay) return NULL;
    return wh_py_record(wh_py_tstate(self)->rec_copy, 6, PyLong_FromUnsignedLongLong(at.gen),
                        PyLong_FromUnsignedLong(at.pos), PyBool_FromLong(at.pad), lay,
                        wh_py_str_or_none(at.corrupt ? at.last_skip : NULL), sums);
}

static PyObject *wh__status_dict(const wh_status_t *s) {
    PyObject *hist = PyList_New(s->nhistory);
    for (int i = 0; hist && i < s->nhistory; i++)
        wh_py_list_put(&hist, i,
                       Py_BuildValue("{sKsdsKsKsd}", "generation",
                                     (unsigned long long)s->history[i].generation, "time",
                                     (double)s->history[i].time_ns / 1e9, "generated",
                                     (unsigned long long)s->history[i].generated, "discarded",
                                     (unsigned long long)s->history[i].discarded, "seal_s",
                                     (double)s->history[i].seal_ns / 1e9));
    if (!hist) return NULL;
    PyObject *areas = PyList_New(s->nareas);
    for (int i = 0; areas && i < s->nareas; i++)
        wh_py_list_put(&areas, i,
                       Py_BuildValue("{sKsIsIsL}", "generation",
                                     (unsigned long long)s->areas[i].generation, "pins",
                                     s->areas[i].pins, "pinners", s->areas[i].pinners, "pin_pid",
                                     (long long)s->areas[i].pin_pid));
    PyObject *readers = areas ? PyList_New(s->nreaders) : NULL;
    for (int i = 0; readers && i < s->nreaders; i++) {
        const typeof(s->readers[0]) *r = &s->readers[i];
        double cap = s->swap_cap ? (double)s->swap_cap : 1.0;
        wh_py_list_put(
            &readers, i,
            Py_BuildValue("{sKsssKsKsKsdsdsdsd}", "pid", (unsigned long long)r->pid, "host",
                          r->host, "generation", (unsigned long long)r->generation, "reads",
                          (unsigned long long)r->reads, "gen_reads",
                          (unsigned long long)r->gen_reads, "reuse", (double)r->gen_reads / cap,
                          "samples_per_s", r->up_s > 0 ? (double)r->reads / r->up_s : 0.0, "up_s",
                          r->up_s, "age_s", r->age_s));
    }
    if (!readers) {
        Py_XDECREF(areas);
        Py_DECREF(hist);
        return NULL;
    }
    return Py_BuildValue(
        "{sKsKsIsIsKsKsKsKsKsKsKsdsKsdsNsNsNssss}", "read_gen", (unsigned long long)s->read_gen,
        "write_gen", (unsigned long long)s->write_gen, "write_fill", s->write_fill, "swap_cap",
        s->swap_cap, "write_bytes", (unsigned long long)s->write_bytes, "byte_budget",
        (unsigned long long)s->byte_budget, "store_bytes", (unsigned long long)s->store_bytes,
        "creator_pid", (unsigned long long)s->creator_pid, "generated",
        (unsigned long long)s->generated, "discarded", (unsigned long long)s->discarded, "seals",
        (unsigned long long)s->seals, "last_put", (double)s->last_put_ns / 1e9, "leader_pid",
        (unsigned long long)s->leader_pid, "lease_left_s", s->lease_left_s, "history", hist,
        "areas", areas, "readers", readers, "origin_id", s->origin_id, "origin", s->origin_name);
}

static PyObject *wh__store_status(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    wh_status_t s;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_status(self->st, &s, &err));
    if (!ok) return wh_py_raise(S, &err);
    return wh__status_dict(&s);
}

static PyObject *wh__store_get_swap_cap(wh__pystore_t *self, void *c) {
    (void)c;
    if (!wh__open(self)) return NULL;
    return PyLong_FromUnsignedLong(self->swap_cap);
}

/* ---- parameters (docs/params.md) ---- */

/* params_set(doc) -> version: doc is the JSON text (bytes or str). */
static PyObject *wh__store_params_set(wh__pystore_t *self, PyObject *args) {
    wh_py_state_t *S = wh_py_tstate(self);
    Py_buffer doc;
    if (!PyArg_ParseTuple(args, "s*", &doc)) return NULL;
    if (!wh__open(self)) {
        PyBuffer_Release(&doc);
        return NULL;
    }
    wh_err_t err = {0};
    uint64_t v = 0;
    bool ok;
    WH_PY_CALL(self, st, ok, &err,
               wh_store_params_set(self->st, doc.buf, (size_t)doc.len, &v, &err));
    PyBuffer_Release(&doc);
    if (!ok) return wh_py_raise(S, &err);
    return PyLong_FromUnsignedLongLong(v);
}

/* params_get() -> (version, JSON bytes); (0, b"{}") when never set. */
static PyObject *wh__store_params_get(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    uint64_t v = 0;
    char *doc = NULL;
    size_t len = 0;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_params_get(self->st, &v, &doc, &len, &err));
    if (!ok) return wh_py_raise(S, &err);
    PyObject *out = Py_BuildValue("(Ky#)", (unsigned long long)v, doc, (Py_ssize_t)len);
    free(doc);
    return out;
}

/* params_version() -> the current version, cheaply (wh_store.h). */
static PyObject *wh__store_params_version(wh__pystore_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__open(self)) return NULL;
    wh_err_t err = {0};
    uint64_t v = 0;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_params_version(self->st, &v, &err));
    if (!ok) return wh_py_raise(S, &err);
    return PyLong_FromUnsignedLongLong(v);
}

/* set_put_params(version): later puts record it; set_min_params(version):
 * readers take only generations made entirely under >= version. */
static PyObject *wh__store_set_put_params(wh__pystore_t *self, PyObject *args) {
    unsigned long long v;
    if (!PyArg_ParseTuple(args, "K", &v) || !wh__open(self)) return NULL;
    bool ok;
    wh_err_t err = {0};
    WH_PY_CALL(self, st, ok, &err, (wh_store_set_put_params(self->st, v), true));
    (void)ok;
    Py_RETURN_NONE;
}

static PyObject *wh__store_set_min_params(wh__pystore_t *self, PyObject *args) {
    unsigned long long v;
    if (!PyArg_ParseTuple(args, "K", &v) || !wh__open(self)) return NULL;
    bool ok;
    wh_err_t err = {0};
    WH_PY_CALL(self, st, ok, &err, (wh_store_set_min_params(self->st, v), true));
    (void)ok;
    Py_RETURN_NONE;
}

/* gen_params(gen) -> {min, max, at_max, samples, skipped}. */
static PyObject *wh__store_gen_params(wh__pystore_t *self, PyObject *args) {
    wh_py_state_t *S = wh_py_tstate(self);
    unsigned long long gen;
    if (!PyArg_ParseTuple(args, "K", &gen) || !wh__open(self)) return NULL;
    wh_err_t err = {0};
    wh_gen_params_t gp;
    bool ok;
    WH_PY_CALL(self, st, ok, &err, wh_store_gen_params(self->st, gen, &gp, &err));
    if (!ok) return wh_py_raise(S, &err);
    return Py_BuildValue("{sKsKsIsIsI}", "min", (unsigned long long)gp.min, "max",
                         (unsigned long long)gp.max, "at_max", gp.at_max, "samples", gp.samples,
                         "skipped", gp.skipped);
}

static PyObject *wh__store_get_last_params(wh__pystore_t *self, void *c) {
    (void)c;
    if (!wh__open(self)) return NULL;
    uint64_t v = 0;
    bool ok;
    wh_err_t err = {0};
    WH_PY_CALL(self, st, ok, &err, (v = wh_store_last_params(self->st), true));
    (void)ok;
    return PyLong_FromUnsignedLongLong(v);
}

static PyMethodDef wh__store_methods[] = {
    {"put", (PyCFunction)(void (*)(void))wh__store_put, METH_VARARGS | METH_KEYWORDS,
     "put(arrays, wait_ms=100) -> PutResult(status, generation)"},
    {"lead", (PyCFunction)wh__store_lead, METH_NOARGS, "acquire or renew the manager lease"},
    {"resign", (PyCFunction)wh__store_resign, METH_NOARGS, "give the manager lease up"},
    {"seal", (PyCFunction)wh__store_seal, METH_NOARGS,
     "seal if full: info dict; {'blocked_pid': P} while a live writer holds the next area; else "
     "None"},
    {"current", (PyCFunction)wh__store_current, METH_NOARGS, "read generation (0: none)"},
    {"pull_from", (PyCFunction)(void (*)(void))wh__store_pull_from, METH_VARARGS | METH_KEYWORDS,
     "pull_from(src, gen, budget=0, wait_s=30.0): mirror sealed generation gen of src here"},
    {"read", (PyCFunction)(void (*)(void))wh__store_read, METH_VARARGS | METH_KEYWORDS,
     "read(gen, pos, want=None) -> list of Array"},
    {"read_sample", (PyCFunction)(void (*)(void))wh__store_read_sample,
     METH_VARARGS | METH_KEYWORDS,
     "read_sample(gen, pos, want=None, timeout=60.0, skip=True) -> SampleRead(generation, "
     "position, is_pad, arrays, skipped)"},
    {"view_sample", (PyCFunction)(void (*)(void))wh__store_view_sample,
     METH_VARARGS | METH_KEYWORDS,
     "view_sample(gen, pos, want=None, timeout=60.0, skip=True): read_sample's result with "
     "arrays viewing the store (a backend with views only; read-only; the generation stays pinned "
     "while any "
     "of them lives)"},
    {"wait_generation", (PyCFunction)(void (*)(void))wh__store_wait_generation,
     METH_VARARGS | METH_KEYWORDS,
     "wait_generation(newer_than=0, timeout=60.0) -> newest read generation"},
    {"read_into", (PyCFunction)wh__store_read_into, METH_VARARGS,
     "read_into(gen, pos, buffers): copy each field into a caller buffer of its size"},
    {"read_sample_into", (PyCFunction)(void (*)(void))wh__store_read_sample_into,
     METH_VARARGS | METH_KEYWORDS,
     "read_sample_into(gen, pos, buffers, timeout=60.0, skip=True) -> SampleCopy(generation, "
     "position, is_pad, layouts, skipped)"},
    {"status", (PyCFunction)wh__store_status, METH_NOARGS, "figures as a dict"},
    {"params_set", (PyCFunction)wh__store_params_set, METH_VARARGS, "params_set(json) -> version"},
    {"params_get", (PyCFunction)wh__store_params_get, METH_NOARGS,
     "params_get() -> (version, json bytes)"},
    {"params_version", (PyCFunction)wh__store_params_version, METH_NOARGS,
     "the current params version, cheaply"},
    {"set_put_params", (PyCFunction)wh__store_set_put_params, METH_VARARGS,
     "set_put_params(version): later puts record it"},
    {"set_min_params", (PyCFunction)wh__store_set_min_params, METH_VARARGS,
     "set_min_params(version): read only generations made under >= version"},
    {"gen_params", (PyCFunction)wh__store_gen_params, METH_VARARGS,
     "gen_params(gen) -> {min, max, at_max, samples, skipped}"},
    {"close", (PyCFunction)wh__store_close, METH_NOARGS, "release the handle"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wh__store_getset[] = {
    {"swap_cap", (getter)wh__store_get_swap_cap, NULL, "SWAP_CAP", NULL},
    {"last_params_version", (getter)wh__store_get_last_params, NULL,
     "params version of the sample the last read returned", NULL},
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

int wh_py_store_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_type(m, &S->store, &wh__store_spec) < 0) return -1;
    return wh_py_store_fns_exec(m, S);
}
