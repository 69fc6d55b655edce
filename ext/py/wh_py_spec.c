/* Spec mode's module functions (docs/reproducible.md): spec_seed, and the
 * claim, put, locate, need, params and status calls over an open Store,
 * each run with the GIL released through wh_py_store_call. A claim crosses
 * as a SpecClaim record and comes back as one. */
#include "wh_py.h"

#include <stdlib.h>
#include <string.h>

#include "wh_plan.h"

static PyStructSequence_Field wh__claim_fields[] = {
    {"index", "the sample index k"},
    {"spec_gen", "k // SWAP_CAP: the spec generation"},
    {"position", "k % SWAP_CAP"},
    {"generation", "the store's id of the generation being filled"},
    {"params_version", "the params version in force for spec_gen"},
    {"attempt", "1 for k's first claim, then one more each time it is claimed again"},
    {"token", "this claim's token (renew, fail)"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__claim_desc = {
    "wirehead_torch._C.SpecClaim",
    "A claimed sample index of a spec-mode store (Store.spec_claim).",
    wh__claim_fields,
    7,
};

static PyObject *wh__claim_record(wh_py_state_t *S, const wh_claim_t *c) {
    return wh_py_record(S->rec_claim, 7, PyLong_FromUnsignedLongLong(c->index),
                        PyLong_FromUnsignedLongLong(c->spec_gen), PyLong_FromUnsignedLong(c->pos),
                        PyLong_FromUnsignedLongLong(c->gen),
                        PyLong_FromUnsignedLongLong(c->params_version),
                        PyLong_FromUnsignedLong(c->attempt), PyLong_FromUnsignedLongLong(c->token));
}

/* A SpecClaim (or any 7-sequence of its ints) back into a claim. */
static int wh__claim_from(PyObject *o, wh_claim_t *c) {
    unsigned long long index, spec_gen, gen, pv, token;
    unsigned int pos, attempt;
    PyObject *t = PySequence_Tuple(o);
    if (!t) return -1;
    int ok = PyArg_ParseTuple(t, "KKIKKIK;a claim is a SpecClaim record", &index, &spec_gen, &pos,
                              &gen, &pv, &attempt, &token);
    Py_DECREF(t);
    if (!ok) return -1;
    *c = (wh_claim_t){index, spec_gen, pos, gen, pv, attempt, token};
    return 0;
}

static PyObject *wh__seed(PyObject *m, PyObject *args, PyObject *kw) {
    (void)m;
    static char *kwlist[] = {"run_seed", "index", NULL};
    unsigned long long seed, k;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KK", kwlist, &seed, &k)) return NULL;
    return PyLong_FromUnsignedLongLong(wh_spec_seed(seed, k));
}

/* ---- the calls, each with its context for wh_py_store_call ---- */

typedef struct {
    double lease_s;
    unsigned max_attempts;
    wh_claim_t c;
    wh_claim_status_t status;
    const char *why;
    bool flag; /* renew: mine; fail: failed; put: sealed */
    wh_spec_put_t put;
    wh_array_t arr[WH_MAX_FIELDS];
    int n;
    uint64_t s, gen;
    char *doc;
    size_t len;
    wh_spec_status_t st;
} wh__spec_ctx_t;

static bool wh__do_claim(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_claim(st, x->lease_s, x->max_attempts, &x->c, &x->status, err);
}
static bool wh__do_renew(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_renew(st, &x->c, x->lease_s, &x->flag, err);
}
static bool wh__do_fail(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_fail(st, &x->c, x->max_attempts, x->why, &x->flag, err);
}
static bool wh__do_put(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_put(st, &x->c, x->arr, x->n, &x->put, &x->flag, err);
}
static bool wh__do_locate(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_locate(st, x->s, &x->gen, err);
}
static bool wh__do_need(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_need(st, x->s, err);
}
static bool wh__do_params(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_params(st, &x->c, &x->doc, &x->len, err);
}
static bool wh__do_status(wh_store_t *st, void *p, wh_err_t *err) {
    wh__spec_ctx_t *x = p;
    return wh_store_spec_status(st, &x->st, err);
}

/* Runs fn over store: 0, or -1 with the exception of its error set. */
static int wh__run(wh_py_state_t *S, PyObject *store, bool (*fn)(wh_store_t *, void *, wh_err_t *),
                   wh__spec_ctx_t *x) {
    wh_err_t err = {0};
    bool ok = false;
    if (wh_py_store_call(S, store, fn, x, &ok, &err) < 0) return -1;
    if (!ok) {
        wh_py_raise(S, &err);
        return -1;
    }
    return 0;
}

/* spec_claim(store, *, lease_s, max_attempts) -> (status, SpecClaim or None) */
static PyObject *wh__claim(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    static char *kwlist[] = {"store", "lease_s", "max_attempts", NULL};
    PyObject *store;
    wh__spec_ctx_t x = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O$dI", kwlist, &store, &x.lease_s,
                                     &x.max_attempts) ||
        wh__run(S, store, wh__do_claim, &x) < 0)
        return NULL;
    if (x.status != WH_CLAIM_OK) return Py_BuildValue("(iO)", (int)x.status, Py_None);
    PyObject *rec = wh__claim_record(S, &x.c);
    return rec ? Py_BuildValue("(iN)", (int)x.status, rec) : NULL;
}

/* spec_renew(store, claim, *, lease_s) -> still this claim's */
static PyObject *wh__renew(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    static char *kwlist[] = {"store", "claim", "lease_s", NULL};
    PyObject *store, *claim;
    wh__spec_ctx_t x = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO$d", kwlist, &store, &claim, &x.lease_s) ||
        wh__claim_from(claim, &x.c) < 0 || wh__run(S, store, wh__do_renew, &x) < 0)
        return NULL;
    return PyBool_FromLong(x.flag);
}

/* spec_fail(store, claim, *, max_attempts, why) -> failed for good */
static PyObject *wh__fail(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    static char *kwlist[] = {"store", "claim", "max_attempts", "why", NULL};
    PyObject *store, *claim;
    wh__spec_ctx_t x = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO$Is", kwlist, &store, &claim, &x.max_attempts,
                                     &x.why) ||
        wh__claim_from(claim, &x.c) < 0 || wh__run(S, store, wh__do_fail, &x) < 0)
        return NULL;
    return PyBool_FromLong(x.flag);
}

/* spec_put(store, claim, arrays) -> (status, sealed) */
static PyObject *wh__put(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    static char *kwlist[] = {"store", "claim", "arrays", NULL};
    PyObject *store, *claim, *arrays;
    wh__spec_ctx_t x = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO", kwlist, &store, &claim, &arrays) ||
        wh__claim_from(claim, &x.c) < 0)
        return NULL;
    Py_buffer views[WH_MAX_FIELDS];
    x.n = wh_py_arrays_get(S, arrays, views, x.arr);
    if (x.n < 0) return NULL;
    int r = wh__run(S, store, wh__do_put, &x);
    for (int i = 0; i < x.n; i++) PyBuffer_Release(&views[i]);
    if (r < 0) return NULL;
    return Py_BuildValue("(iO)", (int)x.put, x.flag ? Py_True : Py_False);
}

/* spec_locate(store, spec_gen) -> generation id (0: not sealed) */
static PyObject *wh__locate(PyObject *m, PyObject *args) {
    wh_py_state_t *S = wh_py_mstate(m);
    PyObject *store;
    wh__spec_ctx_t x = {0};
    unsigned long long s;
    if (!PyArg_ParseTuple(args, "OK", &store, &s)) return NULL;
    x.s = s;
    if (wh__run(S, store, wh__do_locate, &x) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(x.gen);
}

/* spec_need(store, spec_gen) */
static PyObject *wh__need(PyObject *m, PyObject *args) {
    wh_py_state_t *S = wh_py_mstate(m);
    PyObject *store;
    wh__spec_ctx_t x = {0};
    unsigned long long s;
    if (!PyArg_ParseTuple(args, "OK", &store, &s)) return NULL;
    x.s = s;
    if (wh__run(S, store, wh__do_need, &x) < 0) return NULL;
    Py_RETURN_NONE;
}

/* spec_params(store, claim) -> the params document (JSON text) */
static PyObject *wh__params(PyObject *m, PyObject *args) {
    wh_py_state_t *S = wh_py_mstate(m);
    PyObject *store, *claim;
    wh__spec_ctx_t x = {0};
    if (!PyArg_ParseTuple(args, "OO", &store, &claim) || wh__claim_from(claim, &x.c) < 0 ||
        wh__run(S, store, wh__do_params, &x) < 0)
        return NULL;
    PyObject *doc =
        PyUnicode_DecodeUTF8(x.doc ? x.doc : "{}", x.doc ? (Py_ssize_t)x.len : 2, "strict");
    free(x.doc);
    return doc;
}

static PyObject *wh__status_dict(const wh_spec_status_t *s) {
    PyObject *claims = PyList_New(0);
    for (int i = 0; claims && i < s->nclaims && i < WH_SPEC_CLAIMS_SHOWN; i++) {
        PyObject *c =
            Py_BuildValue("{sKsKsssdsI}", "index", (unsigned long long)s->claims[i].index, "pid",
                          (unsigned long long)s->claims[i].pid, "host", s->claims[i].host, "age_s",
                          s->claims[i].age_s, "attempt", s->claims[i].attempt);
        if (!c || PyList_Append(claims, c) < 0) Py_CLEAR(claims);
        Py_XDECREF(c);
    }
    if (!claims) return NULL;
    return Py_BuildValue(
        "{sOsKsOsKsOsKsIsKsOsKsKsKsKsNsOss}", "spec", s->spec ? Py_True : Py_False, "run_seed",
        (unsigned long long)s->run_seed, "any_sealed", s->any_sealed ? Py_True : Py_False,
        "last_sealed", (unsigned long long)s->last_sealed, "open", s->open ? Py_True : Py_False,
        "open_gen", (unsigned long long)s->open_gen, "open_fill", s->open_fill, "floor",
        (unsigned long long)s->floor, "reader", s->reader ? Py_True : Py_False, "slowest",
        (unsigned long long)s->slowest, "slowest_pid", (unsigned long long)s->slowest_pid,
        "duplicates", (unsigned long long)s->duplicates, "nondeterministic",
        (unsigned long long)s->nondeterministic, "claims", claims, "failed",
        s->failed ? Py_True : Py_False, "failure", s->failure);
}

/* spec_status(store) -> dict (spec False for a store not in spec mode) */
static PyObject *wh__status(PyObject *m, PyObject *store) {
    wh_py_state_t *S = wh_py_mstate(m);
    wh__spec_ctx_t *x = calloc(1, sizeof *x);
    if (!x) return PyErr_NoMemory();
    PyObject *res = wh__run(S, store, wh__do_status, x) < 0 ? NULL : wh__status_dict(&x->st);
    free(x);
    return res;
}

#define WH__KW(name, fn, doc)                                                                      \
    { name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc }
static PyMethodDef wh__spec_functions[] = {
    WH__KW(
        "spec_seed", wh__seed,
        "spec_seed(run_seed, index) -> the 64-bit seed of sample index k (docs/reproducible.md)"),
    WH__KW("spec_claim", wh__claim,
           "spec_claim(store, *, lease_s, max_attempts) -> (CLAIM_*, SpecClaim or None)"),
    WH__KW("spec_renew", wh__renew, "spec_renew(store, claim, *, lease_s) -> still ours"),
    WH__KW("spec_fail", wh__fail,
           "spec_fail(store, claim, *, max_attempts, why) -> the index failed for good"),
    WH__KW("spec_put", wh__put, "spec_put(store, claim, arrays) -> (SPEC_PUT_*, sealed)"),
    {"spec_locate", (PyCFunction)wh__locate, METH_VARARGS,
     "spec_locate(store, spec_gen) -> generation id (0: not sealed)"},
    {"spec_need", (PyCFunction)wh__need, METH_VARARGS,
     "spec_need(store, spec_gen): this reader needs spec_gen and later ones"},
    {"spec_params", (PyCFunction)wh__params, METH_VARARGS,
     "spec_params(store, claim) -> the params document of the claim's generation"},
    {"spec_status", (PyCFunction)wh__status, METH_O, "spec_status(store) -> dict"},
    {NULL, NULL, 0, NULL},
};
#undef WH__KW

int wh_py_spec_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_record(m, &S->rec_claim, &wh__claim_desc) < 0 ||
        PyModule_AddIntConstant(m, "CLAIM_OK", WH_CLAIM_OK) ||
        PyModule_AddIntConstant(m, "CLAIM_WAIT", WH_CLAIM_WAIT) ||
        PyModule_AddIntConstant(m, "CLAIM_AHEAD", WH_CLAIM_AHEAD) ||
        PyModule_AddIntConstant(m, "SPEC_PUT_ACCEPTED", WH_SPEC_PUT_ACCEPTED) ||
        PyModule_AddIntConstant(m, "SPEC_PUT_SAME", WH_SPEC_PUT_SAME) ||
        PyModule_AddIntConstant(m, "SPEC_PUT_DIFFERENT", WH_SPEC_PUT_DIFFERENT) ||
        PyModule_AddIntConstant(m, "SPEC_PUT_GONE", WH_SPEC_PUT_GONE) ||
        PyModule_AddIntConstant(m, "SPEC_AHEAD", WH_SPEC_AHEAD))
        return -1;
    return PyModule_AddFunctions(m, wh__spec_functions);
}
