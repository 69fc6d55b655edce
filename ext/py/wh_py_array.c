/* wirehead_torch._C.Array: the type over wh_dlpack.c's instances, a C
 * buffer (host or device) exported through DLPack. */
#include "wh_py.h"

#include "wh_dlpack.h"

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
    return wh_py_shape_tuple(a->ndim, a->shape);
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

int wh_py_array_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_type(m, &S->array, &wh__array_spec) < 0) return -1;
#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION
    S->array->tp_new = NULL; /* Python 3.9 */
#endif
    return 0;
}
