/* DLPack export of C-owned buffers (CPU and CUDA): the instances of
 * wirehead_torch._C.Array and their __dlpack__. wh_py_array.c defines the
 * type (its methods and slots) over these. */
#ifndef WH_DLPACK_H
#define WH_DLPACK_H

#include <Python.h>

#include "wh.h"

/* An Array: a view of a C buffer, kept alive by its reference. */
typedef struct {
    PyObject_HEAD wh_buf_t *buf;
    size_t offset;
    int dtype;
    int ndim;
    /* a stored field has up to WH_MAX_NDIM dims; a batch adds one */
    int64_t shape[WH_MAX_NDIM + 1];
    int64_t strides[WH_MAX_NDIM + 1]; /* in elements, C order */
} wh_array_obj_t;

/* New Array of type (the module's Array type) viewing buf at offset with
 * dtype/shape (C order, at most WH_MAX_NDIM + 1 dims: a batch of fields);
 * takes a new reference to buf. Returns a new Python reference or NULL with
 * an exception set. GIL held. */
PyObject *wh_array_new(PyTypeObject *type, wh_buf_t *buf, size_t offset, int dtype, int ndim,
                       const int64_t *shape);

/* Array.__dlpack__(stream=None, max_version=None, dl_device=None,
 * copy=None): a DLPack capsule sharing (or, with copy=True, copying) the
 * buffer, versioned when max_version >= (1, 0); on a CUDA buffer the
 * consumer's stream waits on the copy that filled it. */
PyObject *wh_array_dlpack(PyObject *self, PyObject *args, PyObject *kw);

#endif
