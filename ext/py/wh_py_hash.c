/* wirehead_torch._C.Xxh3: a streaming XXH3-64, the shard files' checksums
 * (wirehead_torch/shards.py), fast enough to keep up with writing them. */
#include "wh_py.h"

#include <stdio.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* XXH3 with the widest SIMD the CPU has, chosen at run time */
#endif

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

int wh_py_hash_exec(PyObject *m, wh_py_state_t *S) {
    return wh_py_add_type(m, &S->hasher, &wh__hasher_spec);
}
