/* wirehead_torch._C.Ring and ring_fill: the DataLoader workers' batch ring
 * (wh_ring.c) and a worker's fill of one batch (wh_batch.c). */
#include "wh_py.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "wh_dlpack.h"
#include "wh_ring.h"

typedef struct {
    PyObject_HEAD wh_ring_t *r;
} wh__pyring_t;

/* Ring errors: BlockingIOError for a region another process holds,
 * OSError with errno ENOSPC for a full /dev/shm, RuntimeError for a batch
 * refused at hand-over (reclaimed, changed, too big), OSError naming the
 * file otherwise. */
static PyObject *wh__ring_raise(const wh_err_t *err, bool busy) {
    PyObject *cls = PyExc_OSError;
    int no = 0;
    if (busy) {
        cls = PyExc_BlockingIOError;
        no = EWOULDBLOCK;
    } else if (err->code == WH_E_NOSPACE) {
        no = ENOSPC;
    } else if (err->code == WH_E_GONE || err->code == WH_E_CORRUPT || err->code == WH_E_TOOBIG) {
        PyErr_SetString(PyExc_RuntimeError, err->message);
        return NULL;
    }
    if (!no) {
        PyErr_SetString(cls, err->message);
        return NULL;
    }
    PyObject *a = Py_BuildValue("(is)", no, err->message);
    if (a) PyErr_SetObject(cls, a);
    Py_XDECREF(a);
    return NULL;
}

static int wh__ring_init(wh__pyring_t *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"path", "slots", "worker", "main_pid", "label", NULL};
    const char *path, *label = "?";
    unsigned int slots;
    int worker;
    long long main_pid;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sIpL|s", kwlist, &path, &slots, &worker, &main_pid,
                                     &label))
        return -1;
    if (self->r) {
        PyErr_SetString(PyExc_RuntimeError, "Ring: already open");
        return -1;
    }
    wh_err_t err = {0};
    bool busy = false;
    wh_ring_t *r;
    Py_BEGIN_ALLOW_THREADS r = wh_ring_open(path, label, slots, worker, main_pid, &busy, &err);
    Py_END_ALLOW_THREADS if (!r) return wh__ring_raise(&err, busy), -1;
    self->r = r;
    return 0;
}

static void wh__ring_dealloc(wh__pyring_t *self) {
    PyTypeObject *tp = Py_TYPE(self);
    wh_ring_close(self->r);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static bool wh__ring_open(wh__pyring_t *self) {
    if (!self->r) PyErr_SetString(PyExc_ValueError, "Ring: not open");
    return self->r != NULL;
}

/* A uint8 Array over buf's first size bytes; buf's reference passes to it. */
static PyObject *wh__bytes_array(wh_py_state_t *S, wh_buf_t *buf, uint64_t size) {
    int64_t n = (int64_t)size;
    PyObject *a = wh_array_new(S->array, buf, 0, WH_DT_U8, 1, &n);
    wh_buf_unref(buf);
    return a;
}

static PyObject *wh__ring_give_back(wh__pyring_t *self, PyObject *arg) {
    long j = PyLong_AsLong(arg);
    if ((j == -1 && PyErr_Occurred()) || !wh__ring_open(self)) return NULL;
    wh_ring_give_back(self->r, j < 0 || j > INT32_MAX ? -1 : (int)j);
    Py_RETURN_NONE;
}

static PyObject *wh__ring_word(wh__pyring_t *self, PyObject *args) {
    int j, k;
    if (!PyArg_ParseTuple(args, "ii", &j, &k) || !wh__ring_open(self)) return NULL;
    int64_t v;
    wh_err_t err = {0};
    if (!wh_ring_word(self->r, j, k, &v, &err)) return wh__ring_raise(&err, false);
    return PyLong_FromLongLong(v);
}

static PyObject *wh__ring_hash(wh__pyring_t *self, PyObject *args) {
    int j;
    unsigned long long off, n;
    if (!PyArg_ParseTuple(args, "iKK", &j, &off, &n) || !wh__ring_open(self)) return NULL;
    uint64_t h = 0;
    wh_err_t err = {0};
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_ring_hash(self->r, j, off, n, &h, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh__ring_raise(&err, false);
    return PyLong_FromUnsignedLongLong(h);
}

/* A batch's layout as its handle carries it (wh_batch_wire_read, which
 * checks it), read out of the buffer and the buffer released: the slot's
 * bytes and the checks its seal hold. false with err set where refused. */
static bool wh__ring_wire(Py_buffer *wire, wh_batch_wire_t *w, wh_err_t *err) {
    bool ok = wh_batch_wire_read(wire->buf, (size_t)wire->len, 0, w, err);
    w->sums = NULL; /* points into the buffer, released here */
    PyBuffer_Release(wire);
    return ok;
}

/* claim(*, slot, version, sequence, worker_pid, seal, wire, check) */
static PyObject *wh__ring_claim(wh__pyring_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"slot", "version", "sequence", "worker_pid",
                             "seal", "wire",    "check",    NULL};
    int j, check;
    long long ver, seq, wpid;
    unsigned long long sum;
    Py_buffer wire;
    if (wh_py_keywords_only("Ring.claim", args) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kw, "iLLLKy*i", kwlist, &j, &ver, &seq, &wpid, &sum,
                                     &wire, &check))
        return NULL;
    wh_batch_wire_t w;
    wh_err_t refused = {0}, err = {0};
    bool fits = wh__ring_wire(&wire, &w, &refused);
    if (check < WH_RING_CHECK_NONE || check > WH_RING_CHECK_ROWS)
        return PyErr_Format(PyExc_ValueError, "Ring.claim: check must be 0, 1 or 2, got %d", check);
    if (!wh__ring_open(self)) return NULL;
    wh_buf_t *buf = NULL;
    bool ok;
    if (!fits) {
        /* a layout its worker did not write: the slot it names is taken
         * and let go at once, back to its worker as after a refused claim
         * (a handle of another fill takes nothing) */
        Py_BEGIN_ALLOW_THREADS ok =
            wh_ring_claim(self->r, j, ver, seq, wpid, 0, sum, 0, WH_RING_CHECK_NONE, &buf, &err);
        if (ok) wh_buf_unref(buf);
        Py_END_ALLOW_THREADS return wh_py_raise(S, &refused);
    }
    Py_BEGIN_ALLOW_THREADS ok =
        wh_ring_claim(self->r, j, ver, seq, wpid, w.b.hsize, sum, w.checks, check, &buf, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh__ring_raise(&err, false);
    return wh__bytes_array(S, buf, w.b.hsize);
}

/* local(*, slot, wire) */
static PyObject *wh__ring_local(wh__pyring_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"slot", "wire", NULL};
    int j;
    Py_buffer wire;
    if (wh_py_keywords_only("Ring.local", args) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kw, "iy*", kwlist, &j, &wire))
        return NULL;
    wh_batch_wire_t w;
    wh_err_t refused = {0}, err = {0};
    bool fits = wh__ring_wire(&wire, &w, &refused);
    if (!wh__ring_open(self)) return NULL;
    wh_buf_t *buf = NULL;
    bool ok;
    if (!fits) { /* the slot is free again, as after a refused local */
        Py_BEGIN_ALLOW_THREADS ok = wh_ring_local(self->r, j, 0, &buf, &err);
        if (ok) wh_buf_unref(buf);
        Py_END_ALLOW_THREADS return wh_py_raise(S, &refused);
    }
    Py_BEGIN_ALLOW_THREADS ok = wh_ring_local(self->r, j, w.b.hsize, &buf, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh__ring_raise(&err, false);
    return wh__bytes_array(S, buf, w.b.hsize);
}

static PyObject *wh__ring_unlock(wh__pyring_t *self, PyObject *unused) {
    (void)unused;
    if (self->r) wh_ring_unlock(self->r);
    Py_RETURN_NONE;
}

/* ---- ring_fill ---- */

typedef struct {
    wh_ring_t *r;
    wh_batch_fill_t rq;
    uint64_t gen;
    double wait_s;
    const uint32_t *pos;
    const uint8_t *pads;
    int slot;
    wh_buf_t *heap;
    wh_batch_t b;
    void *data;
    uint64_t seal;
    wh_batch_stats_t st;
    bool ring_failed;
} wh__pyfill_t;

static void wh__fill_at(void *ctx, uint32_t i, uint32_t *pos, bool *pad) {
    const wh__pyfill_t *c = ctx;
    *pos = c->pos[i];
    *pad = c->pads && c->pads[i];
}

static bool wh__fill_run(wh_store_t *st, void *ctx, wh_err_t *err) {
    wh__pyfill_t *c = ctx;
    c->rq.st = st;
    return wh_ring_fill(c->r, &c->rq, c->gen, c->wait_s, &c->slot, &c->heap, &c->b, &c->data,
                        &c->seal, &c->st, &c->ring_failed, err);
}

/* Per stored field: its FieldLayout (dtype, shape of one row) and where its
 * rows start, None for a field not wanted. */
static PyObject *wh__fill_layouts(wh_py_state_t *S, const wh__pyfill_t *c, int nfields,
                                  PyObject **offsets) {
    PyObject *out = PyList_New(nfields);
    *offsets = out ? PyList_New(nfields) : NULL;
    if (!*offsets) Py_CLEAR(out);
    for (int f = 0; out && f < nfields; f++) {
        PyObject *o = Py_None, *off = Py_None;
        if (c->rq.want & (1u << f)) {
            const wh_field_meta_t *m = &c->b.meta[f];
            PyObject *shape = wh_py_shape_tuple(m->ndim, m->shape);
            o = shape ? wh_py_record(S->rec_layout, 2,
                                     PyUnicode_FromString(wh_dtype_name(m->dtype)), shape)
                      : NULL;
            off = PyLong_FromUnsignedLongLong(c->b.off[f]);
        } else {
            Py_INCREF(o);
            Py_INCREF(off);
        }
        wh_py_list_put(offsets, f, off);
        wh_py_list_put(&out, f, o);
        if (!*offsets) Py_CLEAR(out);
    }
    if (!out) Py_CLEAR(*offsets);
    return out;
}

/* The rows' int64 extras at off (generation, position, params version). */
static PyObject *wh__fill_i64(const wh__pyfill_t *c, uint64_t off) {
    PyObject *out = PyList_New(c->b.n);
    for (uint32_t i = 0; out && i < c->b.n; i++) {
        int64_t v;
        memcpy(&v, (const char *)c->data + wh_batch_host_off(&c->b, off) + 8 * (uint64_t)i, 8);
        wh_py_list_put(&out, i, PyLong_FromLongLong(v));
    }
    return out;
}

static PyObject *wh__fill_pads(const wh__pyfill_t *c) {
    PyObject *out = PyList_New(c->b.n);
    for (uint32_t i = 0; out && i < c->b.n; i++)
        wh_py_list_put(
            &out, i,
            PyBool_FromLong(((const char *)c->data)[wh_batch_host_off(&c->b, c->b.pad_off) + i]));
    return out;
}

#define WH__FILL_ITEMS 22

static PyObject *wh__none(void) {
    Py_INCREF(Py_None);
    return Py_None;
}

/* pad='ignore': the label fields (stored indices) and the value. */
static int wh__ignore_args(wh_py_state_t *S, wh_batch_fill_t *rq, PyObject *fields,
                           PyObject *value) {
    PyObject *seq = PySequence_Fast(fields, "ignore_fields must be a sequence of field indices");
    if (!seq) return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (k < 0 || k >= WH_MAX_FIELDS) {
            if (!PyErr_Occurred()) PyErr_Format(S->value, "field index %ld out of range", k);
            Py_DECREF(seq);
            return -1;
        }
        rq->ignore_fields |= 1u << k;
    }
    Py_DECREF(seq);
    if (PyLong_Check(value)) {
        rq->ignore_int = PyLong_AsLongLong(value);
        rq->ignore_float = (double)rq->ignore_int;
    } else {
        rq->ignore_float = PyFloat_AsDouble(value);
        rq->ignore_int = (int64_t)rq->ignore_float;
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* The batch's layout as its handle carries it to the main process
 * (wh_batch_wire_write: with rows left in the store, their checksums and
 * how to read them again). */
static PyObject *wh__fill_wire(const wh__pyfill_t *c, const uint64_t *sums) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)wh_batch_wire_size(&c->b));
    if (out) wh_batch_wire_write(&c->b, &c->rq, sums, PyBytes_AS_STRING(out));
    return out;
}

/* ring_fill(*, store, generation, positions, want, timeout, ring=None,
 * pads=b"", skip=True, wait_s=0, ignore_fields=None, ignore_value=None,
 * direct_min=0, spec_gen=None); spec_gen: spec mode's exact read of the
 * generation holding that spec generation (docs/reproducible.md) */
static PyObject *wh__ring_fill(PyObject *module, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(module);
    static char *kwlist[] = {"store",        "generation", "positions", "want",   "timeout",
                             "ring",         "pads",       "skip",      "wait_s", "ignore_fields",
                             "ignore_value", "direct_min", "spec_gen",  NULL};
    PyObject *ring = Py_None, *store, *wantl;
    unsigned long long gen;
    Py_buffer pos, pads = {0};
    double timeout, wait_s = 0;
    int skip = 1;
    PyObject *ignl = Py_None, *ignv = Py_None;
    unsigned long long direct_min = 0;
    PyObject *spec_gen = Py_None;
    if (wh_py_keywords_only("ring_fill", args) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kw, "OKy*Od|Oy*pdOOKO", kwlist, &store, &gen, &pos,
                                     &wantl, &timeout, &ring, &pads, &skip, &wait_s, &ignl, &ignv,
                                     &direct_min, &spec_gen))
        return NULL;
    PyObject *res = NULL, *seq = NULL;
    uint64_t *sums = NULL;
    wh__pyfill_t c;
    memset(&c, 0, sizeof c);
    c.slot = -1;
    uint32_t n = (uint32_t)(pos.len / 4);
    if (ring != Py_None) {
        if (!PyObject_TypeCheck(ring, S->ring) || !wh__ring_open((wh__pyring_t *)ring)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ring must be a Ring or None");
            goto out;
        }
        c.r = ((wh__pyring_t *)ring)->r;
    }
    if (n < 1 || pos.len % 4 || (pads.len && pads.len != (Py_ssize_t)n)) {
        PyErr_SetString(PyExc_ValueError, "ring_fill: positions are uint32, pads one byte each");
        goto out;
    }
    if (!(seq = PySequence_Fast(wantl, "want must be a sequence of field indices"))) goto out;
    int nfields = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (k < 0 || k >= WH_MAX_FIELDS) {
            if (!PyErr_Occurred()) PyErr_Format(S->value, "field index %ld out of range", k);
            goto out;
        }
        c.rq.want |= 1u << k;
        if (k + 1 > nfields) nfields = (int)k + 1;
    }
    if (!(sums = calloc((size_t)n * WH_MAX_FIELDS, sizeof *sums))) {
        PyErr_NoMemory();
        goto out;
    }
    c.rq.n = n;
    c.rq.timeout_s = timeout;
    c.rq.strict = !skip;
    c.rq.at = wh__fill_at;
    c.rq.at_ctx = &c;
    c.rq.sums = sums;
    c.rq.direct_min = direct_min;
    if (spec_gen != Py_None) {
        c.rq.exact = true;
        c.rq.spec_gen = PyLong_AsUnsignedLongLong(spec_gen);
        if (PyErr_Occurred()) goto out;
    }
    if (ignl != Py_None && wh__ignore_args(S, &c.rq, ignl, ignv) < 0) goto out;
    c.gen = gen;
    c.wait_s = wait_s;
    c.pos = pos.buf;
    c.pads = pads.len ? pads.buf : NULL;
    wh_err_t err = {0};
    bool ok = false;
    if (wh_py_store_call(S, store, wh__fill_run, &c, &ok, &err) < 0) goto out;
    if (!ok && !c.st.mismatch) {
        if (c.ring_failed)
            wh__ring_raise(&err, false);
        else
            wh_py_raise(S, &err);
        goto out;
    }
    PyObject *offsets = NULL, *layouts = wh__fill_layouts(S, &c, nfields, &offsets);
    if (!layouts) goto out;
    int64_t ver = 0, sq = 0;
    if (!ok) { /* a row of another layout than the first: named by the caller */
        res = wh_py_record(S->rec_fill, WH__FILL_ITEMS, PyLong_FromLong(-1), PyLong_FromLong(0),
                           PyLong_FromLong(0), wh__none(), layouts, offsets, PyLong_FromLong(0),
                           PyLong_FromLong(0), PyLong_FromLong(0), PyLong_FromLong(0),
                           PyLong_FromLong(0), PyList_New(0), PyList_New(0), PyList_New(0),
                           PyList_New(0), PyLong_FromUnsignedLongLong(c.st.corrupt),
                           wh_py_str_or_none(c.st.corrupt ? c.st.last_skip : NULL),
                           PyLong_FromUnsignedLongLong(c.st.mismatch_gen),
                           PyLong_FromUnsignedLong(c.st.mismatch_pos), wh__none(), wh__none(),
                           PyBool_FromLong(0));
        goto out;
    }
    /* a slot's bytes reach Python through claim or local; heap memory here */
    wh_buf_t *mb = c.heap;
    c.heap = NULL;
    PyObject *mem = NULL;
    if (mb)
        mem = wh__bytes_array(S, mb, c.b.size);
    else if (wh_ring_stamp(c.r, c.slot, &ver, &sq, &err))
        mem = wh__none();
    else
        wh__ring_raise(&err, false);
    PyObject *wire = mem ? wh__fill_wire(&c, sums) : NULL;
    if (!wire) {
        Py_XDECREF(mem);
        Py_DECREF(layouts);
        Py_DECREF(offsets);
    } else {
        res = wh_py_record(
            S->rec_fill, WH__FILL_ITEMS, PyLong_FromLong(c.slot), PyLong_FromLongLong(ver),
            PyLong_FromLongLong(sq), mem, layouts, offsets,
            PyLong_FromUnsignedLongLong(c.b.pad_off), PyLong_FromUnsignedLongLong(c.b.gen_off),
            PyLong_FromUnsignedLongLong(c.b.pos_off), PyLong_FromUnsignedLongLong(c.b.pv_off),
            PyLong_FromUnsignedLongLong(c.b.size), wh__fill_i64(&c, c.b.gen_off),
            wh__fill_i64(&c, c.b.pos_off), wh__fill_pads(&c), wh__fill_i64(&c, c.b.pv_off),
            PyLong_FromUnsignedLongLong(c.st.corrupt),
            wh_py_str_or_none(c.st.corrupt ? c.st.last_skip : NULL), wh__none(), wh__none(),
            PyLong_FromUnsignedLongLong(c.seal), wire, PyBool_FromLong(c.b.direct != 0));
    }
    if (!res && c.slot >= 0) wh_ring_give_back(c.r, c.slot);
out:
    wh_buf_unref(c.heap);
    free(sums);
    Py_XDECREF(seq);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&pads);
    return res;
}

static PyMethodDef wh__ring_methods[] = {
    {"give_back", (PyCFunction)wh__ring_give_back, METH_O,
     "give_back(j): a worker's slot j back unsent"},
    {"word", (PyCFunction)wh__ring_word, METH_VARARGS, "word(j, k): control word k of slot j"},
    {"hash", (PyCFunction)wh__ring_hash, METH_VARARGS,
     "hash(j, offset, n): XXH3-64 of n bytes of slot j from offset"},
    {"claim", (PyCFunction)(void (*)(void))wh__ring_claim, METH_VARARGS | METH_KEYWORDS,
     "claim(*, slot, version, sequence, worker_pid, seal, wire, check): the main process takes "
     "a handle's slot and checks it (check 0: the control words only, 1: and the seal and the "
     "extras, 2: and every row); wire: the batch's layout as ring_fill wrote it, which says "
     "the slot's bytes and the checks its seal holds; a uint8 Array over the slot whose last "
     "user hands it back"},
    {"local", (PyCFunction)(void (*)(void))wh__ring_local, METH_VARARGS | METH_KEYWORDS,
     "local(*, slot, wire): a slot taken by this process as a uint8 Array whose last user "
     "hands it back"},
    {"unlock", (PyCFunction)wh__ring_unlock, METH_NOARGS, "unlock(): release the region's lock"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot wh__ring_slots[] = {
    {Py_tp_init, wh__ring_init},
    {Py_tp_dealloc, wh__ring_dealloc},
    {Py_tp_methods, wh__ring_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "Ring(path, slots, worker, main_pid, label='?'): one region of the DataLoader "
                "workers' batch ring (ext/read/wh_ring.h). worker=True takes the region's lock "
                "(BlockingIOError if another live process holds it) and reclaims the slots the "
                "main process does not hold."},
    {0, NULL},
};

static PyType_Spec wh__ring_spec = {
    "wirehead_torch._C.Ring", sizeof(wh__pyring_t), 0, Py_TPFLAGS_DEFAULT, wh__ring_slots,
};

static PyObject *wh__ring_exit_with(PyObject *unused, PyObject *args) {
    (void)unused;
    long long main_pid, parent;
    const char *dir, *prefix;
    if (!PyArg_ParseTuple(args, "LLss", &main_pid, &parent, &dir, &prefix)) return NULL;
    wh_err_t err = {0};
    if (!wh_ring_exit_with(main_pid, parent, dir, prefix, &err)) return wh__ring_raise(&err, false);
    Py_RETURN_NONE;
}

static PyObject *wh__ring_term_removes(PyObject *unused, PyObject *args) {
    (void)unused;
    const char *dir, *prefix;
    if (!PyArg_ParseTuple(args, "ss", &dir, &prefix)) return NULL;
    wh_err_t err = {0};
    bool installed = false;
    if (!wh_ring_term_removes(dir, prefix, &installed, &err)) return wh__ring_raise(&err, false);
    return PyBool_FromLong(installed);
}

static PyMethodDef wh__ring_functions[] = {
    {"ring_term_removes", (PyCFunction)wh__ring_term_removes, METH_VARARGS,
     "ring_term_removes(dir, prefix) -> bool: SIGTERM of this process removes this user's files "
     "in dir named prefix* before it ends the process as the default would; only where SIGTERM "
     "has its default disposition (False otherwise); Linux only (ext/read/wh_ring.h)"},
    {"ring_exit_with", (PyCFunction)wh__ring_exit_with, METH_VARARGS,
     "ring_exit_with(main_pid, parent, dir, prefix): this DataLoader worker ends (SIGTERM) when "
     "its parent dies, first removing this user's files in dir named prefix* once main_pid is "
     "gone (parent: the worker's parent while main_pid lives, 0: a forkserver's child); a "
     "SIGTERM from another process while main_pid lives is ignored; "
     "Linux only (ext/read/wh_ring.h)"},
    {"ring_fill", (PyCFunction)(void (*)(void))wh__ring_fill, METH_VARARGS | METH_KEYWORDS,
     "ring_fill(*, store, generation, positions, want, timeout, ring=None, pads=b'', "
     "skip=True, wait_s=0, ignore_fields=None, ignore_value=None, direct_min=0) -> RingFill: one "
     "batch read (each sample once, through the read policy, from generation on) into a free "
     "slot of ring, or heap memory when none comes free in wait_s (ring None: always); "
     "positions uint32 and pads one byte per row, as bytes; skip: a corrupt sample is "
     "skipped (a neighbour stands in), else an error naming it. ignore_fields, ignore_value: "
     "pad='ignore', the padding rows' "
     "label fields filled with the value (the caller checks it fits). direct_min > 0 (a "
     "slot of an shm store): rows of at least that many bytes stay in the store for the main "
     "process's device copy (docs/gpu.md), each checked here once per process."},
    {NULL, NULL, 0, NULL},
};

static PyStructSequence_Field wh__fill_fields[] = {
    {"slot", "the ring slot filled, -1: heap memory (or nothing, see mismatch_generation)"},
    {"version", "the slot's file version (for its handle)"},
    {"sequence", "the slot's fill sequence (for its handle)"},
    {"memory", "uint8 Array over the batch's bytes in heap memory; None for a slot (claimed or "
               "taken locally) or a mismatch"},
    {"layouts", "per stored field the FieldLayout of one row (the first row's), None if not "
                "wanted"},
    {"offsets", "per stored field where its rows start, None if not wanted"},
    {"pad_offset", "where is_pad (uint8 per row) starts"},
    {"generation_offset", "where generation (int64 per row) starts"},
    {"position_offset", "where position (int64 per row) starts"},
    {"params_version_offset", "where params_version (int64 per row) starts"},
    {"size", "bytes the batch fills"},
    {"generation", "per row, the generation read"},
    {"position", "per row, the position read"},
    {"is_pad", "per row, padding (the plan's, or a corrupt sample skipped)"},
    {"params_version", "per row, the params version of the sample read"},
    {"skipped", "corrupt samples skipped"},
    {"last_skip", "why the last was skipped, None if none was"},
    {"mismatch_generation", "a row of another layout than the first: its generation (nothing "
                            "is held then); None otherwise"},
    {"mismatch_position", "that row's position; None otherwise"},
    {"seal", "a slot's seal: the XXH3-64 of its header and row table (0 for heap memory)"},
    {"wire", "the batch's layout as its handle carries it to the main process (bytes, read "
             "back and checked only in C: Ring.claim, Ring.local, CudaStage.copy_slot); None "
             "on a mismatch"},
    {"in_store", "some fields' rows stayed in the store (direct_min): the main process copies "
                 "them from there"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__fill_desc = {
    "wirehead_torch._C.RingFill",
    "One batch as ring_fill read it.",
    wh__fill_fields,
    WH__FILL_ITEMS,
};

int wh_py_ring_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_type(m, &S->ring, &wh__ring_spec) < 0 ||
        wh_py_add_record(m, &S->rec_fill, &wh__fill_desc) < 0 ||
        PyModule_AddIntConstant(m, "RING_CHECK_SLOT", WH_RING_CHECK_SLOT) < 0 ||
        PyModule_AddIntConstant(m, "RING_CHECK_ROWS", WH_RING_CHECK_ROWS) < 0)
        return -1;
    return PyModule_AddFunctions(m, wh__ring_functions);
}
