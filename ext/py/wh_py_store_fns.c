/* The Store binding's module level: a store configuration from keyword
 * arguments (Store and Loader take one), the module functions over a
 * store's configuration (clean, mongo_collections), the process's copy
 * counters, and the records the store's results come in. */
#include "wh_py.h"

#include <string.h>

#include "wh_backend.h" /* only for shm_layout (tests forge damage) and shm_origin */
#include "wh_guard.h"

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
        "create", "min_params", "origin_id", "origin_name",       NULL};
    PyObject *uri, *fields, *dbname = Py_None, *prefix = Py_None;
    PyObject *origin_id = Py_None, *origin_name = Py_None;
    unsigned long swap_cap = 0;
    unsigned long long byte_budget = WH_BYTE_BUDGET_AUTO, chunk_bytes = 4ull << 20;
    double lease_s = 10.0, connect_timeout_s = 10.0;
    int verify = 1, create = 1;
    unsigned long long min_params = 0;
    memset(out, 0, sizeof *out);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "UkO|KKOOddppKOO", kwlist, &uri, &swap_cap, &fields,
                                     &byte_budget, &chunk_bytes, &dbname, &prefix, &lease_s,
                                     &connect_timeout_s, &verify, &create, &min_params, &origin_id,
                                     &origin_name))
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
    if (!(lease_s > 0 && lease_s < 1e6) || !(connect_timeout_s > 0 && connect_timeout_s < 1e6)) {
        PyErr_SetString(S->value, "LEASE_SECONDS and CONNECT_TIMEOUT must be positive "
                                  "numbers of seconds below 10^6");
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
    return Py_BuildValue("{snsnsnsnsnsnsnsnsnsnsnsnsnsn}", "hdr_lock", (Py_ssize_t)l.hdr_lock,
                         "leader_pid", (Py_ssize_t)l.leader_pid, "leader_token",
                         (Py_ssize_t)l.leader_token, "lease_expiry_ns",
                         (Py_ssize_t)l.lease_expiry_ns, "lease_ns", (Py_ssize_t)l.lease_ns, "slots",
                         (Py_ssize_t)l.slots, "slot_size", (Py_ssize_t)l.slot_size, "slot_lock",
                         (Py_ssize_t)l.slot_lock, "slot_gen", (Py_ssize_t)l.slot_gen, "slot_used",
                         (Py_ssize_t)l.slot_used, "slot_count", (Py_ssize_t)l.slot_count,
                         "slot_nholes", (Py_ssize_t)l.slot_nholes, "slot_holes",
                         (Py_ssize_t)l.slot_holes, "hdr_size", (Py_ssize_t)l.hdr_size);
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
     METH_VARARGS | METH_KEYWORDS, "collection names of a mongodb:// store's database"},
    {"counters", wh__counters, METH_NOARGS, "process-wide copy counters"},
    {"counters_reset", wh__counters_reset, METH_NOARGS, "zero the copy counters"},
    {"shm_layout", wh__shm_layout, METH_NOARGS, "byte offsets inside an shm segment (for tests)"},
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

int wh_py_store_fns_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_record(m, &S->rec_put, &wh__put_desc) < 0 ||
        wh_py_add_record(m, &S->rec_read, &wh__read_desc) < 0 ||
        wh_py_add_record(m, &S->rec_copy, &wh__copy_desc) < 0 ||
        wh_py_add_record(m, &S->rec_layout, &wh__layout_desc) < 0)
        return -1;
    return PyModule_AddFunctions(m, wh__store_functions);
}
