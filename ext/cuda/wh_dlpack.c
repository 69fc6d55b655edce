/* DLPack producer: one allocation per exported tensor, holding a reference
 * to the C buffer; deleters touch no Python object so they are safe from
 * any thread and after interpreter shutdown. */
#define PY_SSIZE_T_CLEAN
#include "wh_dlpack.h"

#include "wh_cuda.h"

#include <dlpack/dlpack.h>
#include <stdlib.h>
#include <string.h>

/* DLPack 1.0 versioned struct, as the published spec defines it (Debian
 * ships the 0.6 header, which lacks it). */
typedef struct {
    uint32_t major;
    uint32_t minor;
} wh__dlversion_t;

typedef struct wh__mtv {
    wh__dlversion_t version;
    void *manager_ctx;
    void (*deleter)(struct wh__mtv *self);
    uint64_t flags;
    DLTensor dl_tensor;
} wh__managed_versioned_t;

#define WH__DL_BOOL 6                     /* kDLBool, DLPack >= 0.8 */
#define WH__DL_FLAG_IS_COPIED (1ULL << 1) /* DLPACK_FLAG_BITMASK_IS_COPIED, DLPack 1.0 */

PyObject *wh_array_new(PyTypeObject *type, wh_buf_t *buf, size_t offset, int dtype, int ndim,
                       const int64_t *shape) {
    if (ndim < 0 || ndim > WH_MAX_NDIM + 1) {
        PyErr_Format(PyExc_ValueError, "wirehead_torch.Array: %d dimensions, at most %d", ndim,
                     WH_MAX_NDIM + 1);
        return NULL;
    }
    wh_array_obj_t *a = PyObject_New(wh_array_obj_t, type);
    if (!a) return NULL;
    wh_buf_ref(buf);
    a->buf = buf;
    a->offset = offset;
    a->dtype = dtype;
    a->ndim = ndim;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        a->shape[d] = shape[d];
        a->strides[d] = st;
        st *= shape[d];
    }
    return (PyObject *)a;
}

static DLDataType wh__dl_dtype(int dtype, bool versioned) {
    DLDataType t = {kDLUInt, 8, 1};
    size_t bits = wh_dtype_size(dtype) * 8;
    t.bits = (uint8_t)bits;
    switch (dtype) {
    case WH_DT_BOOL: t.code = versioned ? WH__DL_BOOL : kDLUInt; break;
    case WH_DT_U8:
    case WH_DT_U16:
    case WH_DT_U32:
    case WH_DT_U64: t.code = kDLUInt; break;
    case WH_DT_I8:
    case WH_DT_I16:
    case WH_DT_I32:
    case WH_DT_I64: t.code = kDLInt; break;
    case WH_DT_F16:
    case WH_DT_F32:
    case WH_DT_F64: t.code = kDLFloat; break;
    case WH_DT_BF16: t.code = kDLBfloat; break;
    default: t.code = kDLComplex; break;
    }
    return t;
}

/* One allocation: the managed tensor plus its shape and strides. */
typedef struct {
    union {
        DLManagedTensor v0;
        wh__managed_versioned_t v1;
    } m;
    wh_buf_t *buf;
    int64_t shape[WH_MAX_NDIM + 1];
    int64_t strides[WH_MAX_NDIM + 1];
    bool gpu;        /* a device buffer of wh_cuda.c */
    intptr_t stream; /* the consumer's stream it was exported for */
} wh__export_t;

static void wh__export_free(wh__export_t *e) {
    /* the consumer's queued work must finish before the buffer is refilled */
    if (e->gpu) wh_gpu_exported_done(e->buf, e->stream);
    wh_buf_unref(e->buf);
    free(e);
}
static void wh__deleter_v0(DLManagedTensor *m) { wh__export_free(m->manager_ctx); }
static void wh__deleter_v1(wh__managed_versioned_t *m) { wh__export_free(m->manager_ctx); }

static void wh__capsule_v0(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (m && m->deleter) m->deleter(m);
    }
}
static void wh__capsule_v1(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        wh__managed_versioned_t *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m && m->deleter) m->deleter(m);
    }
}

/* The array API's stream argument for CUDA: None is the legacy default
 * stream (1), 2 the per-thread default stream, -1 no synchronisation, a
 * larger integer a cudaStream_t; 0 is ambiguous and refused. The consumer's
 * stream is made to wait on the copy that filled the buffer. */
static bool wh__cuda_stream(wh_buf_t *buf, PyObject *stream, intptr_t *out) {
    long long v = 1;
    if (stream != Py_None) {
        if (!PyLong_Check(stream) || PyBool_Check(stream)) {
            PyErr_Format(PyExc_TypeError,
                         "wirehead_torch.Array.__dlpack__: stream must be None "
                         "or an int for a CUDA array, got %s",
                         Py_TYPE(stream)->tp_name);
            return false;
        }
        int overflow = 0;
        v = PyLong_AsLongLongAndOverflow(stream, &overflow);
        if (overflow > 0)
            v = (long long)PyLong_AsUnsignedLongLong(stream); /* a pointer above 2^63 */
        if (PyErr_Occurred() || overflow < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError,
                                "wirehead_torch.Array.__dlpack__: stream out of range");
            return false;
        }
    }
    wh_err_t err = {0};
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_gpu_export(buf, (intptr_t)v, &err);
    Py_END_ALLOW_THREADS if (!ok) {
        PyErr_Format(err.code == WH_E_INVALID ? PyExc_ValueError : PyExc_BufferError, "%s",
                     err.message);
        return false;
    }
    *out = (intptr_t)v;
    return true;
}

PyObject *wh_array_dlpack(PyObject *self, PyObject *args, PyObject *kw) {
    wh_array_obj_t *a = (wh_array_obj_t *)self;
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", kwlist, &stream, &max_version, &dl_device,
                                     &copy))
        return NULL;
    bool versioned = false;
    if (max_version != Py_None) {
        long major = -1;
        if (PyTuple_Check(max_version) && PyTuple_GET_SIZE(max_version) >= 1)
            major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
        if (major == -1 && PyErr_Occurred()) return NULL;
        versioned = major >= 1;
    }
    if (copy != Py_None && !PyBool_Check(copy)) {
        PyErr_SetString(PyExc_TypeError,
                        "wirehead_torch.Array.__dlpack__: copy must be None or a bool");
        return NULL;
    }
    if (dl_device != Py_None) {
        int dt = 0, di = 0;
        if (!PyArg_ParseTuple(dl_device, "ii;dl_device must be (device_type, device_id)", &dt, &di))
            return NULL;
        if (dt != a->buf->device_type || di != a->buf->device_id) {
            PyErr_Format(PyExc_BufferError,
                         "wirehead_torch.Array lives on device (%d, %d); export to (%d, %d) "
                         "is not supported",
                         a->buf->device_type, a->buf->device_id, dt, di);
            return NULL;
        }
    }
    intptr_t cstream = 0;
    if (a->buf->device_type == kDLCUDA && !wh__cuda_stream(a->buf, stream, &cstream)) return NULL;
    wh_buf_t *src = a->buf;
    size_t src_off = a->offset;
    if (copy == Py_True) {
        /* the array API asks the producer to copy: a fresh buffer owned by the capsule */
        if (a->buf->device_type != kDLCPU) {
            PyErr_SetString(PyExc_BufferError,
                            "wirehead_torch.Array: copy=True is supported for host arrays only");
            return NULL;
        }
        size_t n = wh_dtype_size(a->dtype);
        for (int d = 0; d < a->ndim; d++) n *= (size_t)a->shape[d];
        src = wh_buf_new(n);
        if (!src) return PyErr_NoMemory();
        Py_BEGIN_ALLOW_THREADS memcpy(src->data, (char *)a->buf->data + a->offset, n);
        Py_END_ALLOW_THREADS src_off = 0;
    } else {
        wh_buf_ref(src);
    }
    wh__export_t *e = calloc(1, sizeof *e);
    if (!e) {
        wh_buf_unref(src);
        return PyErr_NoMemory();
    }
    e->buf = src;
    e->gpu = a->buf->device_type == kDLCUDA;
    e->stream = cstream;
    memcpy(e->shape, a->shape, sizeof e->shape);
    memcpy(e->strides, a->strides, sizeof e->strides);
    DLTensor *t = versioned ? &e->m.v1.dl_tensor : &e->m.v0.dl_tensor;
    /* offset folded into data: torch before 2.x ignores byte_offset */
    t->data = (char *)src->data + src_off;
    t->byte_offset = 0;
    t->device.device_type = (DLDeviceType)a->buf->device_type;
    t->device.device_id = a->buf->device_id;
    t->ndim = a->ndim;
    t->dtype = wh__dl_dtype(a->dtype, versioned);
    t->shape = e->shape;
    t->strides = e->strides;
    PyObject *cap;
    if (versioned) {
        e->m.v1.version.major = 1;
        e->m.v1.version.minor = 0;
        e->m.v1.manager_ctx = e;
        e->m.v1.deleter = wh__deleter_v1;
        if (copy == Py_True) e->m.v1.flags = WH__DL_FLAG_IS_COPIED;
        cap = PyCapsule_New(&e->m.v1, "dltensor_versioned", wh__capsule_v1);
    } else {
        e->m.v0.manager_ctx = e;
        e->m.v0.deleter = wh__deleter_v0;
        cap = PyCapsule_New(&e->m.v0, "dltensor", wh__capsule_v0);
    }
    if (!cap) wh__export_free(e);
    return cap;
}
