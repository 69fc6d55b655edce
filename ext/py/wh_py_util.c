/* The helpers every binding file shares (declared in wh_py.h): errors to
 * exceptions, records, types and lists. Called by wh_py_module.c and the
 * wh_py_*.c files; calls none of them. */
#include "wh_py.h"

#include <stdarg.h>
#include <stdio.h>

PyObject *wh_py_raise(wh_py_state_t *S, const wh_err_t *err) {
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
    case WH_E_SPECFAIL: cls = S->specfail; break;
    default: break;
    }
    PyErr_SetString(cls, err->message[0] ? err->message : "wirehead_torch: unknown error");
    return NULL;
}

PyObject *wh_py_shape_tuple(int ndim, const int64_t *shape) {
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

void wh_py_list_put(PyObject **list, Py_ssize_t i, PyObject *item) {
    if (!item)
        Py_CLEAR(*list);
    else
        PyList_SET_ITEM(*list, i, item);
}

int wh_py_add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *bases,
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

int wh_py_add_type(PyObject *m, PyTypeObject **slot, PyType_Spec *spec) {
    *slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    return *slot ? PyModule_AddType(m, *slot) : -1;
}

int wh_py_add_record(PyObject *m, PyTypeObject **slot, PyStructSequence_Desc *desc) {
    *slot = PyStructSequence_NewType(desc);
    return *slot ? PyModule_AddType(m, *slot) : -1;
}

PyObject *wh_py_record(PyTypeObject *type, int n, ...) {
    va_list ap;
    va_start(ap, n);
    PyObject *r = PyStructSequence_New(type);
    bool ok = r != NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = va_arg(ap, PyObject *);
        if (!v) ok = false;
        if (ok)
            PyStructSequence_SET_ITEM(r, i, v);
        else
            Py_XDECREF(v);
    }
    va_end(ap);
    if (!ok) Py_CLEAR(r); /* the items it holds go with it */
    return r;
}

int wh_py_keywords_only(const char *fn, PyObject *args) {
    if (!args || PyTuple_GET_SIZE(args) == 0) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only (%zd given by position)", fn,
                 PyTuple_GET_SIZE(args));
    return -1;
}

PyObject *wh_py_str_or_none(const char *s) {
    if (s) return PyUnicode_FromString(s);
    Py_INCREF(Py_None);
    return Py_None;
}

int wh_py_u32(PyObject *obj, void *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "an integer is required, got %.100s", Py_TYPE(obj)->tp_name);
        return 0;
    }
    unsigned long v = PyLong_AsUnsignedLong(obj); /* negative: OverflowError */
    if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%R is not in 0..%lu", obj, (unsigned long)UINT32_MAX);
        return 0;
    }
    *(uint32_t *)out = (uint32_t)v;
    return 1;
}
