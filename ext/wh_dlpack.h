/* DLPack export of C-owned buffers (CPU now, CUDA-ready): the Python type
 * wirehead_torch._C.Array with __dlpack__/__dlpack_device__. */
#ifndef WH_DLPACK_H
#define WH_DLPACK_H

#include <Python.h>

#include "wh.h"

/* A reference-counted byte buffer. release(buf) runs when the last
 * reference goes, from whatever thread drops it (no GIL assumed). */
typedef struct wh_buf wh_buf_t;
struct wh_buf {
    uint64_t refs; /* atomic */
    void *data;
    size_t size;
    int device_type; /* DLPack device type: 1 CPU, 2 CUDA, 3 CUDA host */
    int device_id;
    void (*release)(wh_buf_t *buf);
    void *owner; /* for release */
};

/* New heap buffer of size bytes (64-byte aligned), refs = 1; NULL on OOM. */
wh_buf_t *wh_buf_new(size_t size);
void wh_buf_ref(wh_buf_t *b);
void wh_buf_unref(wh_buf_t *b);

/* New _C.Array viewing buf at offset with dtype/shape (C order); takes a
 * new reference to buf. Returns a new Python reference or NULL with an
 * exception set. GIL held. */
PyObject *wh_array_new(wh_buf_t *buf, size_t offset, int dtype, int ndim,
                       const int64_t *shape);

/* Registers the Array type on the module. */
int wh_dlpack_init(PyObject *module);

#endif
