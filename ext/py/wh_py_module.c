/* wirehead_torch._C: the module definition (multi-phase init with module
 * state) and the exception types. The types and functions come from the
 * wh_py_*.c files, one per bound type; the helpers they share (the mapping
 * of wh_err_t codes onto the exceptions among them) are in wh_py_util.c. */
#include "wh_py.h"

#include "wh_fault.h"
#include "wh_ring.h"

#define WH__ONE(f) +1
_Static_assert(sizeof(wh_py_state_t) == (0 WH_PY_STATE_FIELDS(WH__ONE)) * sizeof(void *),
               "WH_PY_STATE_FIELDS names every field of the module state");
#undef WH__ONE

static int wh__add_excs(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_exc(m, &S->base, "WireheadError", NULL, "Base of wirehead_torch errors."))
        return -1;
#define WH__SUB(slot, name, extra, doc)                                                            \
    do {                                                                                           \
        PyObject *b = (extra) ? PyTuple_Pack(2, S->base, (extra)) : PyTuple_Pack(1, S->base);      \
        int r = b ? wh_py_add_exc(m, &S->slot, name, b, doc) : -1;                                 \
        Py_XDECREF(b);                                                                             \
        if (r) return -1;                                                                          \
    } while (0)
    WH__SUB(value, "InvalidSampleError", PyExc_ValueError, "Bad input (sample, argument).");
    WH__SUB(schema, "SchemaMismatchError", PyExc_ValueError,
            "The store was made with another format, SAMPLE or SWAP_CAP.");
    WH__SUB(gone, "GenerationGoneError", NULL, "The generation was reclaimed during a read.");
    WH__SUB(corrupt, "CorruptSampleError", NULL, "Stored bytes failed validation.");
    WH__SUB(nospace, "StoreSpaceError", PyExc_OSError, "Not enough space to create the store.");
    WH__SUB(toobig, "SampleTooLargeError", PyExc_ValueError,
            "A sample does not fit the store's byte budget.");
    WH__SUB(timeout, "StoreTimeoutError", PyExc_TimeoutError, "A bounded wait ran out.");
    WH__SUB(unavail, "StoreUnavailableError", PyExc_ConnectionError,
            "The store's server cannot be reached.");
    WH__SUB(notfound, "NotFoundError", PyExc_LookupError, "No such generation or position.");
    {
        PyObject *b = PyTuple_Pack(1, S->notfound);
        int r = b ? wh_py_add_exc(m, &S->nostore, "StoreNotCreatedError", b,
                                  "The shm store does not exist yet: with BYTE_BUDGET auto the "
                                  "first generator's first sample creates it.")
                  : -1;
        Py_XDECREF(b);
        if (r) return -1;
    }
    WH__SUB(lease, "LeaseLostError", NULL, "This manager does not hold the manager lease.");
    WH__SUB(pinned, "PinLimitError", NULL,
            "A store-backed view would break the pin policy; read a copy instead.");
    WH__SUB(specfail, "SpecFailedError", NULL,
            "Spec mode: a sample index failed every attempt (docs/reproducible.md).");
#undef WH__SUB
    return 0;
}

static int wh__exec(PyObject *m) {
    wh_py_state_t *S = wh_py_mstate(m);
    if (wh_py_store_exec(m, S) < 0 || wh_py_loader_exec(m, S) < 0 || wh_py_map_exec(m, S) < 0 ||
        wh_py_array_exec(m, S) < 0 || wh__add_excs(m, S) < 0 || wh_py_cuda_exec(m, S) < 0 ||
        wh_py_plan_exec(m, S) < 0 || wh_py_hash_exec(m, S) < 0 || wh_py_ring_exec(m, S) < 0 ||
        wh_py_spec_exec(m, S) < 0)
        return -1;
    PyObject *d = PyDict_New();
    for (int i = 1; d && i < WH_DT_MAX_; i++) {
        PyObject *v = PyLong_FromLong(i);
        if (!v || PyDict_SetItemString(d, wh_dtype_name(i), v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    if (!d) return -1;
    if (PyModule_AddObject(m, "DTYPES", d) < 0) {
        Py_DECREF(d);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "PUT_ACCEPTED", WH_PUT_ACCEPTED) ||
        PyModule_AddIntConstant(m, "PUT_DISCARDED", WH_PUT_DISCARDED) ||
        PyModule_AddIntConstant(m, "PUT_WAIT", WH_PUT_WAIT) ||
        PyModule_AddIntConstant(m, "FORMAT_VERSION", WH_FORMAT_VERSION) ||
        PyModule_AddIntConstant(m, "FAULT_HOOKS", WH_FAULTS_BUILT) ||
        PyModule_AddIntConstant(m, "MAX_FIELDS", WH_MAX_FIELDS) ||
        PyModule_AddIntConstant(m, "MAX_NDIM", WH_MAX_NDIM) ||
        PyModule_AddIntConstant(m, "SWAP_CAP_MIN", WH_SWAP_CAP_MIN) ||
        PyModule_AddIntConstant(m, "SWAP_CAP_MAX", WH_SWAP_CAP_MAX) ||
        PyModule_AddIntConstant(m, "BYTE_BUDGET_AUTO", WH_BYTE_BUDGET_AUTO) ||
        PyModule_AddIntConstant(m, "BYTE_BUDGET_MIN", WH_BYTE_BUDGET_MIN) ||
        PyModule_AddIntConstant(m, "RING_SLOTS_MAX", WH_RING_SLOTS_MAX))
        return -1;
    return 0;
}

static int wh__traverse(PyObject *m, visitproc visit, void *arg) {
    wh_py_state_t *S = wh_py_mstate(m);
#define WH__VISIT(f) Py_VISIT(S->f);
    WH_PY_STATE_FIELDS(WH__VISIT)
#undef WH__VISIT
    return 0;
}

static int wh__clear(PyObject *m) {
    wh_py_state_t *S = wh_py_mstate(m);
#define WH__CLEAR(f) Py_CLEAR(S->f);
    WH_PY_STATE_FIELDS(WH__CLEAR)
#undef WH__CLEAR
    return 0;
}

static void wh__free(void *m) { wh__clear((PyObject *)m); }

static PyModuleDef_Slot wh__slots[] = {
    {Py_mod_exec, (void *)wh__exec},
    {0, NULL},
};

static struct PyModuleDef wh__module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "wirehead_torch._C",
    .m_doc = "wirehead_torch C core",
    .m_size = sizeof(wh_py_state_t),
    .m_slots = wh__slots,
    .m_traverse = wh__traverse,
    .m_clear = wh__clear,
    .m_free = wh__free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&wh__module); }
