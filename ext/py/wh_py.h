/* Private to the Python bindings (ext/py/wh_py_*.c): the module state and the
 * helpers the binding files share. One file binds each type (Array, Store,
 * CudaStage, Loader, SharedMap, Ring, Xxh3) plus the plan functions; wh_py_module.c holds
 * the module definition and the exception types, wh_py_util.c the shared
 * helpers (the error mapping among them); the Store type's module level
 * (config from keywords, module functions, result records) is in
 * wh_py_store_fns.c. Each
 * binding file adds its types and functions to the module through its
 * wh_py_*_exec, called once from the module's exec slot. */
#ifndef WH_PY_H
#define WH_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include "wh.h"
#include "wh_cuda.h"
#include "wh_store.h"

/* Module state (multi-phase init, PEP 489): this module instance's
 * exceptions and types. Methods reach it through their type, which is bound
 * to the module (PyType_FromModuleAndSpec), so an object made by one
 * instance raises that instance's exceptions, and the module lives as long
 * as any of its objects. */
typedef struct {
    PyObject *base, *value, *schema, *gone, *corrupt, *nospace, *toobig, *timeout, *unavail,
        *notfound, *nostore, *lease, *pinned, *cuda, *specfail;
    PyTypeObject *array, *store, *loader, *map, *ring, *stage, *hasher;
    /* the named records results come in (struct sequences: still tuples) */
    PyTypeObject *rec_put, *rec_read, *rec_copy, *rec_layout, *rec_batch, *rec_items, *rec_resume,
        *rec_fill, *rec_backend, *rec_shm_files, *rec_claim;
} wh_py_state_t;

/* one X() per field, laid out by hand */
/* clang-format off */
#define WH_PY_STATE_FIELDS(X)                                                                 \
    X(base) X(value) X(schema) X(gone) X(corrupt) X(nospace) X(toobig) X(timeout) X(unavail) \
    X(notfound) X(nostore) X(lease) X(pinned) X(cuda) X(specfail) X(array) X(store) X(loader) X(map) X(ring) X(stage) \
    X(hasher) \
    X(rec_put) X(rec_read) X(rec_copy) X(rec_layout) X(rec_batch) X(rec_items) X(rec_resume) X(rec_fill) \
    X(rec_backend) X(rec_shm_files) X(rec_claim)
/* clang-format on */

static inline wh_py_state_t *wh_py_mstate(PyObject *module) {
    return (wh_py_state_t *)PyModule_GetState(module);
}

/* The state of the module whose type made self (the types are final). */
static inline wh_py_state_t *wh_py_tstate(void *self) {
    return (wh_py_state_t *)PyType_GetModuleState(Py_TYPE((PyObject *)self));
}

/* Sets the exception of err's code (its message) and returns NULL. */
PyObject *wh_py_raise(wh_py_state_t *S, const wh_err_t *err);

/* A tuple of ndim ints, or NULL with an exception set. */
PyObject *wh_py_shape_tuple(int ndim, const int64_t *shape);

/* Item i of *list (a new list) is item; a failed item (NULL) drops the list. */
void wh_py_list_put(PyObject **list, Py_ssize_t i, PyObject *item);

/* A new exception class kept in *slot (the state's reference) and added to
 * the module as name; a heap type bound to module m, kept in *slot and
 * added to m. 0 or -1 with an exception set. */
int wh_py_add_exc(PyObject *m, PyObject **slot, const char *name, PyObject *bases, const char *doc);
int wh_py_add_type(PyObject *m, PyTypeObject **slot, PyType_Spec *spec);

/* A named record type (a struct sequence: a tuple whose items also have
 * names), kept in *slot and added to m. 0 or -1 with an exception set. */
int wh_py_add_record(PyObject *m, PyTypeObject **slot, PyStructSequence_Desc *desc);

/* A new record of type from its n items, in order (references stolen); a
 * NULL item (its exception set) releases the others and gives NULL. */
PyObject *wh_py_record(PyTypeObject *type, int n, ...);

/* 0 when args (a call's positional arguments) is empty, else -1 with a
 * TypeError naming fn: its arguments are keywords only (a call that names
 * each one cannot pass them in another order). */
int wh_py_keywords_only(const char *fn, PyObject *args);

/* s as a str, or None when s is NULL. */
PyObject *wh_py_str_or_none(const char *s);

/* An "O&" converter: a Python int in 0..UINT32_MAX into the uint32_t at out;
 * anything else an OverflowError or TypeError, never a value cut to 32 bits
 * as the "I" format cuts it (wh_py_util.c). */
int wh_py_u32(PyObject *obj, void *out);

/* A store configuration from keyword arguments (wh_py_store_fns.c). */
typedef struct {
    wh_store_config_t cfg;
    PyObject *keep; /* owns the UTF-8 strings cfg points into */
} wh_py_cfgbuf_t;

/* Store(...)'s arguments into out; the caller drops out->keep after use. */
bool wh_py_parse_cfg(wh_py_state_t *S, PyObject *args, PyObject *kw, wh_py_cfgbuf_t *out);

/* Runs fn on the handle of store (a Store of this module) with the GIL
 * released and the handle's mutex held: 0 with *ok its result, or -1 with
 * an exception set when store is no open Store (wh_py_store.c). */
int wh_py_store_call(wh_py_state_t *S, PyObject *store,
                     bool (*fn)(wh_store_t *, void *, wh_err_t *), void *ctx, bool *ok,
                     wh_err_t *err);

/* A sample's arrays (a sequence of (buffer, dtype_code)) into views and arr
 * (WH_MAX_FIELDS each): the number of fields, whose views the caller
 * releases, or -1 with an exception set and nothing held (wh_py_store.c). */
int wh_py_arrays_get(wh_py_state_t *S, PyObject *arrays, Py_buffer *views, wh_array_t *arr);

/* The cut-over for rows copied straight from a store at uri into *min (0:
 * none, and why says why): the registered path where the store is a mapping
 * this process can register; WIREHEAD_GPU_DIRECT_MIN_ROW sets it in bytes,
 * or "off" (to measure either path); a value that is neither is false with
 * err naming it. wh_py_cuda.c */
bool wh_py_gpu_direct_min(const char *uri, uint64_t *min, char *why, size_t cap, wh_err_t *err);

/* The GPU stage's counters merged into dict d (wh_py_cuda.c). */
int wh_py_gpu_stats_into(PyObject *d, const wh_gpu_stats_t *st);

/* Runs expr with the GIL released and the handle's mutex (self->mu) held.
 * handle is the field (st or ld) checked under the mutex: a close() from
 * another thread may have detached it meanwhile, which reads as "closed". */
#define WH_PY_CALL(self, handle, ok, err, expr)                                                    \
    do {                                                                                           \
        Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&(self)->mu);                                    \
        if ((self)->handle)                                                                        \
            ok = (expr);                                                                           \
        else                                                                                       \
            ok = wh_err_set(err, WH_E_INVALID, "the handle was closed");                           \
        pthread_mutex_unlock(&(self)->mu);                                                         \
        Py_END_ALLOW_THREADS                                                                       \
    } while (0)

/* Each adds its file's types and functions to m (and their slots of S). */
int wh_py_array_exec(PyObject *m, wh_py_state_t *S);
int wh_py_store_exec(PyObject *m, wh_py_state_t *S);
/* the Store binding's records and module functions, from wh_py_store_exec */
int wh_py_store_fns_exec(PyObject *m, wh_py_state_t *S);
int wh_py_cuda_exec(PyObject *m, wh_py_state_t *S);
int wh_py_loader_exec(PyObject *m, wh_py_state_t *S);
int wh_py_plan_exec(PyObject *m, wh_py_state_t *S);
int wh_py_map_exec(PyObject *m, wh_py_state_t *S);
int wh_py_hash_exec(PyObject *m, wh_py_state_t *S);
int wh_py_ring_exec(PyObject *m, wh_py_state_t *S);
int wh_py_spec_exec(PyObject *m, wh_py_state_t *S);

#endif
