/* DLPack export of C-owned buffers (CPU now, CUDA-ready): the Python type
 * wirehead_torch._C.Array with __dlpack__/__dlpack_device__. */
#ifndef WH_DLPACK_H
#define WH_DLPACK_H

#include <Python.h>

#include "wh.h"

/* New Array of type (the module's, from wh_dlpack_init) viewing buf at
 * offset with dtype/shape (C order, at most WH_MAX_NDIM + 1 dims: a batch
 * of fields); takes a new reference to buf. Returns a new Python reference
 * or NULL with an exception set. GIL held. */
PyObject *wh_array_new(PyTypeObject *type, wh_buf_t *buf, size_t offset, int dtype, int ndim,
                       const int64_t *shape);

/* Makes the Array type bound to module (it keeps the module alive while an
 * Array lives) and adds it as module.Array. Returns a new reference to the
 * type, which the caller keeps in its module state, or NULL. */
PyTypeObject *wh_dlpack_init(PyObject *module);

#endif
