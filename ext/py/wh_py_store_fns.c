/* The Store binding's module level: a store configuration from keyword
 * arguments (Store and Loader take one), the module functions over a
 * store's configuration (clean, mongo_collections), what a URI's backend
 * can do (backend_of), the shm backend's name rule, files and a segment's
 * recorded source, the bounds and defaults both C and Python write, the
 * process's copy counters, and the records the store's results come in. */
#include "wh_py.h"

#include <string.h>

#include "wh_guard.h"
#include "wh_mongo.h"
#include "wh_shm.h"
#include "wh_shmfile.h"

/* ---- store configuration from keyword arguments ---- */

static const char *wh__opt_str(PyObject *o, PyObject *keep) {
    if (!o || o == Py_None) return NULL;
    PyObject *b = PyUnicode_AsUTF8String(o);
    if (!b) return NULL;
    PyList_Append(keep, b);
    Py_DECREF(b);
    return PyBytes_AS_STRING(b);
}

bool wh_py_parse_cfg(wh_py_state_t *S, PyObject *args, PyObject *kw, wh_py_cfgbuf_t *out) {
    static char *kwlist[] = {
        "uri",    "swap_cap",   "fields",    "byte_budget",       "chunk_bytes",
        "dbname", "prefix",     "lease_s",   "connect_timeout_s", "verify_reads",
        "create", "min_params", "origin_id", "origin_name",       "run_seed",
        NULL};
    PyObject *uri, *fields, *dbname = Py_None, *prefix = Py_None, *run_seed = Py_None;
    PyObject *origin_id = Py_None, *origin_name = Py_None;
    unsigned long swap_cap = 0;
    unsigned long long byte_budget = WH_BYTE_BUDGET_AUTO, chunk_bytes = WH_MONGO_CHUNK_DEFAULT;
    double lease_s = WH_LEASE_S_DEFAULT, connect_timeout_s = WH_CONNECT_TIMEOUT_S_DEFAULT;
    int verify = 1, create = 1;
    unsigned long long min_params = 0;
    memset(out, 0, sizeof *out);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UkO|KKOOddppKOOO", kwlist, &uri, &swap_cap, &fields,
                                     &byte_budget, &chunk_bytes, &dbname, &prefix, &lease_s,
                                     &connect_timeout_s, &verify, &create, &min_params, &origin_id,
                                     &origin_name, &run_seed))
        return false;
    out->keep = PyList_New(0);
    if (!out->keep) return false;
    wh_store_config_t *c = &out->cfg;
    c->uri = wh__opt_str(uri, out->keep);
    c->dbname = wh__opt_str(dbname, out->keep);
    c->prefix = wh__opt_str(prefix, out->keep);
    c->origin_id = wh__opt_str(origin_id, out->keep);
    c->origin_name = wh__opt_str(origin_name, out->keep);
    if (PyErr_Occurred()) goto fail;
    wh_err_t range = {0};
    if (!wh_swap_cap_check(swap_cap, "SWAP_CAP", &range)) {
        wh_py_raise(S, &range);
        goto fail;
    }
    if (!(lease_s > 0 && lease_s < WH_SECONDS_MAX) ||
        !(connect_timeout_s > 0 && connect_timeout_s < WH_SECONDS_MAX)) {
        PyErr_Format(S->value,
                     "LEASE_SECONDS and CONNECT_TIMEOUT must be positive numbers of seconds "
                     "below %.0f",
                     WH_SECONDS_MAX);
        goto fail;
    }
    c->swap_cap = (uint32_t)swap_cap;
    c->byte_budget = byte_budget;
    c->chunk_bytes = chunk_bytes;
    c->lease_s = lease_s;
    c->connect_timeout_s = connect_timeout_s;
    c->verify_reads = verify;
    c->no_create = !create;
    c->min_params = min_params;
    if (run_seed != Py_None) { /* spec mode: an int in 0..2^64-1 */
        c->spec = true;
        c->run_seed = PyLong_Check(run_seed) ? PyLong_AsUnsignedLongLong(run_seed) : 0;
        if (!PyLong_Check(run_seed) || PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(S->value, "RUN_SEED must be an integer in 0..2**64-1");
            goto fail;
        }
    }
    PyObject *seq = PySequence_Fast(fields, "fields must be a sequence of names");
    if (!seq) goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char *names[WH_MAX_FIELDS];
    if (n > WH_MAX_FIELDS) n = WH_MAX_FIELDS + 1; /* let schema_init report it */
    for (Py_ssize_t i = 0; i < n && i < WH_MAX_FIELDS; i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, i);
        names[i] = PyUnicode_Check(s) ? wh__opt_str(s, out->keep) : NULL;
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            goto fail;
        }
    }
    Py_DECREF(seq);
    wh_err_t err = {0};
    if (!wh_schema_init(&c->schema, (int)n, names, &err)) {
        wh_py_raise(S, &err);
        goto fail;
    }
    return true;
fail:
    Py_CLEAR(out->keep);
    return false;
}

/* ---- module functions ---- */

static PyObject *wh__clean(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    wh_py_cfgbuf_t cb;
    if (!wh_py_parse_cfg(S, args, kw, &cb)) return NULL;
    wh_err_t err = {0};
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_store_clean(&cb.cfg, &err);
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!ok) return wh_py_raise(S, &err);
    Py_RETURN_NONE;
}

/* mongo_collections(uri, ...): the names of the collections in a MongoDB
 * store's database, whoever made them. */
static PyObject *wh__mongo_collections(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    wh_py_cfgbuf_t cb;
    if (!wh_py_parse_cfg(S, args, kw, &cb)) return NULL;
    wh_err_t err = {0};
    char **names = NULL;
    bool ok;
    Py_BEGIN_ALLOW_THREADS ok = wh_store_collections(&cb.cfg, &names, &err);
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!ok) return wh_py_raise(S, &err);
    PyObject *list = PyList_New(0);
    for (char **p = names; list && *p; p++) {
        PyObject *s = PyUnicode_DecodeUTF8(*p, (Py_ssize_t)strlen(*p), "replace");
        if (!s || PyList_Append(list, s) < 0) Py_CLEAR(list);
        Py_XDECREF(s);
    }
    wh_store_names_free(names);
    return list;
}

static PyObject *wh__counters(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_counters_t c;
    wh_counters_get(&c);
    uint64_t hits, misses, idle;
    wh_pool_stats(&hits, &misses, &idle);
    return Py_BuildValue(
        "{sKsKsKsKsKsK}", "bytes_copied_out", (unsigned long long)c.bytes_copied_out,
        "bytes_copied_in", (unsigned long long)c.bytes_copied_in, "copies_out",
        (unsigned long long)c.copies_out, "pool_hits", (unsigned long long)hits, "pool_misses",
        (unsigned long long)misses, "pool_idle_bytes", (unsigned long long)idle);
}

/* shm_layout() -> byte offsets inside an shm segment (tests that forge
 * damage) and the header's size (what a store reserves in /dev/shm). */
static PyObject *wh__shm_layout(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_shm_layout_t l;
    wh_shm_layout(&l);
    return Py_BuildValue(
        "{snsnsnsnsnsnsnsnsnsnsnsnsnsnsnsnsnsnsn}", "hdr_lock", (Py_ssize_t)l.hdr_lock,
        "leader_pid", (Py_ssize_t)l.leader_pid, "leader_token", (Py_ssize_t)l.leader_token,
        "lease_expiry_ns", (Py_ssize_t)l.lease_expiry_ns, "lease_ns", (Py_ssize_t)l.lease_ns,
        "slots", (Py_ssize_t)l.slots, "slot_size", (Py_ssize_t)l.slot_size, "slot_lock",
        (Py_ssize_t)l.slot_lock, "slot_gen", (Py_ssize_t)l.slot_gen, "slot_used",
        (Py_ssize_t)l.slot_used, "slot_count", (Py_ssize_t)l.slot_count, "slot_nholes",
        (Py_ssize_t)l.slot_nholes, "slot_holes", (Py_ssize_t)l.slot_holes, "hdr_size",
        (Py_ssize_t)l.hdr_size, "slot_spec_label", (Py_ssize_t)l.slot_spec_label, "slot_spec_state",
        (Py_ssize_t)l.slot_spec_state, "slot_spec_check", (Py_ssize_t)l.slot_spec_check,
        "claim_size", (Py_ssize_t)l.claim_size, "hdr_spec_off", (Py_ssize_t)l.hdr_spec_off);
}

/* shm_origin(name) -> None when no shm store is under name, else
 * (origin_id, origin_name) its segment records ("", "": a plain store):
 * whose copy `status` is looking at, without opening it as one. */
static PyObject *wh__shm_origin(PyObject *m, PyObject *args) {
    wh_py_state_t *S = wh_py_mstate(m);
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    char id[WH_ORIGIN_ID_LEN], oname[WH_ORIGIN_NAME_LEN];
    bool found = false, ok;
    wh_err_t err = {0};
    Py_BEGIN_ALLOW_THREADS ok = wh_shm_origin(name, &found, id, oname, &err);
    Py_END_ALLOW_THREADS if (!ok) return wh_py_raise(S, &err);
    if (!found) Py_RETURN_NONE;
    return Py_BuildValue("(ss)", id, oname);
}

/* backend_of(uri) -> Backend: what the scheme table says of uri's scheme. */
static PyObject *wh__backend_of(PyObject *m, PyObject *arg) {
    wh_py_state_t *S = wh_py_mstate(m);
    const char *uri = PyUnicode_AsUTF8(arg);
    if (!uri) return NULL;
    wh_backend_info_t b;
    wh_err_t err = {0};
    if (!wh_store_backend_of(uri, &b, &err)) return wh_py_raise(S, &err);
    return wh_py_record(
        S->rec_backend, 10, PyUnicode_FromString(b.scheme), PyUnicode_FromString(b.backend),
        PyBool_FromLong(b.caps & WH_CAP_VIEWS), PyBool_FromLong(b.caps & WH_CAP_PINS),
        PyBool_FromLong(b.caps & WH_CAP_MAPPABLE), PyBool_FromLong(b.caps & WH_CAP_PARAMS_FILE),
        PyBool_FromLong(b.caps & WH_CAP_RELAY_SOURCE),
        PyBool_FromLong(b.caps & WH_CAP_RELAY_TARGET), wh_py_str_or_none(b.name),
        PyBool_FromLong(b.caps & WH_CAP_SPEC));
}

/* shm_check_name(name): raises the name rule's error. */
static PyObject *wh__shm_check_name(PyObject *m, PyObject *arg) {
    wh_py_state_t *S = wh_py_mstate(m);
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    wh_err_t err = {0};
    if (!wh_shm_check_name(name, &err)) return wh_py_raise(S, &err);
    Py_RETURN_NONE;
}

/* shm_files(name) -> ShmFiles: the /dev/shm paths a store of that name makes. */
static PyObject *wh__shm_files(PyObject *m, PyObject *arg) {
    wh_py_state_t *S = wh_py_mstate(m);
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    wh_shm_files_t f;
    wh_err_t err = {0};
    if (!wh_shm_files(name, &f, &err)) return wh_py_raise(S, &err);
    return wh_py_record(S->rec_shm_files, 5, PyUnicode_FromString(f.segment),
                        PyUnicode_FromString(f.params), PyUnicode_FromString(f.relay_lock),
                        PyUnicode_FromString(f.relay_state),
                        PyUnicode_FromString(WH_SHMFILE_DIR "/" WH_SHMFILE_RING));
}

/* shm_segment_bytes(swap_cap, byte_budget, spec=False) -> the /dev/shm
 * bytes a segment of that geometry reserves (spec: a spec-mode store). */
static PyObject *wh__shm_segment_bytes(PyObject *m, PyObject *args) {
    wh_py_state_t *S = wh_py_mstate(m);
    unsigned long long cap, budget;
    int spec = 0;
    if (!PyArg_ParseTuple(args, "KK|p", &cap, &budget, &spec)) return NULL;
    wh_err_t err = {0};
    uint64_t total = 0;
    if (!wh_swap_cap_check(cap, "SWAP_CAP", &err) ||
        !wh_shm_segment_bytes((uint32_t)cap, budget, spec, &total, &err))
        return wh_py_raise(S, &err);
    return PyLong_FromUnsignedLongLong(total);
}

static PyObject *wh__counters_reset(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_counters_reset();
    Py_RETURN_NONE;
}

static PyObject *wh__guard_step_aside(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_guard_step_aside();
    Py_RETURN_NONE;
}

static PyObject *wh__guard_restore(PyObject *m, PyObject *unused) {
    (void)m;
    (void)unused;
    wh_guard_restore();
    Py_RETURN_NONE;
}

static PyMethodDef wh__store_functions[] = {
    {"clean", (PyCFunction)(void (*)(void))wh__clean, METH_VARARGS | METH_KEYWORDS,
     "clean(uri, swap_cap, fields, ...): remove everything this store holds"},
    {"mongo_collections", (PyCFunction)(void (*)(void))wh__mongo_collections,
     METH_VARARGS | METH_KEYWORDS,
     "collection names of a store's database (a backend that keeps collections)"},
    {"counters", wh__counters, METH_NOARGS, "process-wide copy counters"},
    {"counters_reset", wh__counters_reset, METH_NOARGS, "zero the copy counters"},
    {"shm_layout", wh__shm_layout, METH_NOARGS, "byte offsets inside an shm segment (for tests)"},
    {"backend_of", wh__backend_of, METH_O,
     "backend_of(uri) -> Backend: the backend of uri's scheme and what its stores can do "
     "(InvalidSampleError naming the schemes known for any other)"},
    {"shm_check_name", wh__shm_check_name, METH_O,
     "shm_check_name(name): InvalidSampleError saying the rule when name is no shm store name"},
    {"shm_files", wh__shm_files, METH_O,
     "shm_files(name) -> ShmFiles: the /dev/shm paths of an shm store's files"},
    {"shm_segment_bytes", wh__shm_segment_bytes, METH_VARARGS,
     "shm_segment_bytes(swap_cap, byte_budget, spec=False) -> bytes of /dev/shm such a "
     "segment reserves"},
    {"shm_origin", wh__shm_origin, METH_VARARGS,
     "shm_origin(name): the source an shm store's segment records, or None"},
    {"guard_step_aside", wh__guard_step_aside, METH_NOARGS,
     "the SIGBUS guard puts back the handler it displaced (before a call that saves the handler "
     "in front to chain to)"},
    {"guard_restore", wh__guard_restore, METH_NOARGS,
     "the SIGBUS guard back in front, once it was installed in this process"},
    {NULL, NULL, 0, NULL},
};

/* ---- the records the store's results come in ---- */

static PyStructSequence_Field wh__put_fields[] = {
    {"status", "PUT_ACCEPTED, PUT_DISCARDED (the generation is full) or PUT_WAIT (no "
               "space yet: try again)"},
    {"generation", "the write generation the sample was offered to"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__put_desc = {
    "wirehead_torch._C.PutResult",
    "What Store.put did with a sample.",
    wh__put_fields,
    2,
};

/* SampleRead and SampleCopy: the same five, the fourth being arrays or layouts */
static PyStructSequence_Field wh__read_fields[] = {
    {"generation", "the generation read (the newest when the one asked for was reclaimed)"},
    {"position", "the position read (a neighbour's when a corrupt sample was skipped)"},
    {"is_pad", "True when a neighbour stands in for a skipped corrupt sample"},
    {"arrays", "one Array per field, None for a field not wanted"},
    {"skipped", "why the sample asked for was skipped (str), or None"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__read_desc = {
    "wirehead_torch._C.SampleRead",
    "A sample as Store.read_sample or view_sample read it through the read policy.",
    wh__read_fields,
    5,
};

static PyStructSequence_Field wh__copy_fields[] = {
    {"generation", "the generation read (the newest when the one asked for was reclaimed)"},
    {"position", "the position read (a neighbour's when a corrupt sample was skipped)"},
    {"is_pad", "True when a neighbour stands in for a skipped corrupt sample"},
    {"layouts", "one FieldLayout per field copied, None for a field skipped"},
    {"skipped", "why the sample asked for was skipped (str), or None"},
    {"checksums", "the stored XXH3-64 of each field copied, None for a field skipped"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__copy_desc = {
    "wirehead_torch._C.SampleCopy",
    "A sample as Store.read_sample_into copied it into the caller's buffers.",
    wh__copy_fields,
    6,
};

static PyStructSequence_Field wh__layout_fields[] = {
    {"dtype", "the stored dtype's name"},
    {"shape", "the field's shape (a tuple of ints)"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__layout_desc = {
    "wirehead_torch._C.FieldLayout",
    "The dtype and shape of a field as read.",
    wh__layout_fields,
    2,
};

static PyStructSequence_Field wh__backend_fields[] = {
    {"scheme", "the URI's scheme as written: shm, mongodb, mongodb+srv"},
    {"backend", "the backend it names: shm, mongodb"},
    {"views", "store-backed views (Store.view_sample)"},
    {"pins", "copies that pin their generation against reclamation"},
    {"mappable", "views point into a mapping a device can register (the GPU's direct path)"},
    {"params_file", "params kept in a side file of the store's own (shm_files().params)"},
    {"relay_source", "a relay can copy from it: a STORE that may have a LOCAL_CACHE"},
    {"relay_target", "a relay can copy into it: a LOCAL_CACHE copy"},
    {"name", "the store's name after the scheme, for a backend whose stores are named "
             "locally (not checked: shm_check_name); None where the URI is a server's address"},
    {"spec", "spec mode: claims, puts at a position (RUN_SEED, docs/reproducible.md)"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__backend_desc = {
    "wirehead_torch._C.Backend",
    "What the scheme table says of a URI's scheme (backend_of).",
    wh__backend_fields,
    10,
};

static PyStructSequence_Field wh__shm_files_fields[] = {
    {"segment", "the store's segment"},
    {"params", "its params side file"},
    {"relay_lock", "the lock file of the relay filling it (a LOCAL_CACHE copy)"},
    {"relay_state", "that relay's figures"},
    {"ring_prefix", "the path every DataLoader batch ring file starts with (any store)"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__shm_files_desc = {
    "wirehead_torch._C.ShmFiles",
    "The /dev/shm files the package makes for an shm store name (shm_files).",
    wh__shm_files_fields,
    5,
};

static int wh__add_float(PyObject *m, const char *name, double v) {
    PyObject *o = PyFloat_FromDouble(v);
    if (!o || PyModule_AddObject(m, name, o) < 0) { /* steals o only on success */
        Py_XDECREF(o);
        return -1;
    }
    return 0;
}

/* The bounds and defaults C and Python both write: Python reads C's. */
static int wh__add_bounds(PyObject *m) {
    if (wh__add_float(m, "SECONDS_MAX", WH_SECONDS_MAX) ||
        wh__add_float(m, "LEASE_SECONDS_DEFAULT", WH_LEASE_S_DEFAULT) ||
        wh__add_float(m, "CONNECT_TIMEOUT_DEFAULT", WH_CONNECT_TIMEOUT_S_DEFAULT) ||
        PyModule_AddIntConstant(m, "SHM_AREAS", WH_SHM_AREAS) ||
        PyModule_AddIntConstant(m, "SHM_NAME_MAX", WH_SHM_NAME_MAX) ||
        PyModule_AddIntConstant(m, "PARAMS_MAX", WH_PARAMS_MAX) ||
        PyModule_AddIntConstant(m, "FIELD_NAME_MAX", WH_MAX_NAME - 1) ||
        PyModule_AddIntConstant(m, "CHUNK_BYTES_MAX", WH_MONGO_CHUNK_MAX) ||
        PyModule_AddIntConstant(m, "CHUNK_BYTES_DEFAULT", WH_MONGO_CHUNK_DEFAULT) ||
        PyModule_AddStringConstant(m, "SHM_DIR", WH_SHMFILE_DIR) ||
        PyModule_AddStringConstant(m, "RING_PREFIX", WH_SHMFILE_RING))
        return -1;
    return 0;
}

int wh_py_store_fns_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_record(m, &S->rec_put, &wh__put_desc) < 0 ||
        wh_py_add_record(m, &S->rec_read, &wh__read_desc) < 0 ||
        wh_py_add_record(m, &S->rec_copy, &wh__copy_desc) < 0 ||
        wh_py_add_record(m, &S->rec_layout, &wh__layout_desc) < 0 ||
        wh_py_add_record(m, &S->rec_backend, &wh__backend_desc) < 0 ||
        wh_py_add_record(m, &S->rec_shm_files, &wh__shm_files_desc) < 0 || wh__add_bounds(m) < 0)
        return -1;
    return PyModule_AddFunctions(m, wh__store_functions);
}
