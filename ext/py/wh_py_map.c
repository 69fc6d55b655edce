/* wirehead_torch._C.SharedMap: a mapped ring file with atomic control words
 * (wh_ring.h), the raw view tests and tools take of a ring's or the store's
 * file; the ring itself is _C.Ring (wh_py_ring.c). */
#include "wh_py.h"

#include <errno.h>
#include <string.h>

#include "wh_ring.h"

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

static PyObject *wh__map_hash(wh__map_obj *self, PyObject *args) {
    Py_ssize_t a = 0, b = -1;
    if (!PyArg_ParseTuple(args, "n|n", &a, &b)) return NULL;
    Py_ssize_t off = b < 0 ? 0 : a, n = b < 0 ? a : b; /* hash(n) or hash(offset, n) */
    if (off < 0 || n < 0)
        return PyErr_Format(PyExc_ValueError, "SharedMap.hash: offset and n must be >= 0");
    wh_err_t err = {0};
    uint64_t h = 0;
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_map_hash(&self->map, (size_t)off, (size_t)n, &h, &err);
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
    {"hash", (PyCFunction)wh__map_hash, METH_VARARGS,
     "hash(n) or hash(offset, n): XXH3-64 of the first n bytes, or of n bytes from offset"},
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

int wh_py_map_exec(PyObject *m, wh_py_state_t *S) {
    return wh_py_add_type(m, &S->map, &wh__map_spec);
}
