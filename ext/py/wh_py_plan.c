/* The sample order (wh_plan.c) as module functions: plan_info, plan_items,
 * plan_resume. */
#include "wh_py.h"

#include <string.h>

#include "wh_plan.h"

/* The plan's keywords (drop_last optional), then up to 3 optional integers
 * named by extra (NULL-terminated; the plan functions each take their own). */
static bool wh__parse_plan(wh_py_state_t *S, PyObject *args, PyObject *kw, wh_plan_t *p,
                           const char *const *extra, unsigned long long *a, unsigned long long *b,
                           unsigned long long *c) {
    char *kwlist[14] = {"swap_cap", "world", "rank",      "workers", "worker", "batch", "shuffle",
                        "seed",     "pad",   "drop_last", NULL,      NULL,     NULL,    NULL};
    char fmt[32] = "O&O&O&O&O&O&pKi|p"; /* O&: wh_py_u32, never an int cut to 32 bits */
    for (int i = 0; extra && extra[i] && i < 3; i++) {
        kwlist[10 + i] = (char *)extra[i];
        strcat(fmt, "K");
    }
    int shuffle = 0, drop_last = 0;
    memset(p, 0, sizeof *p);
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, wh_py_u32, &p->swap_cap, wh_py_u32,
                                     &p->world, wh_py_u32, &p->rank, wh_py_u32, &p->workers,
                                     wh_py_u32, &p->worker, wh_py_u32, &p->batch, &shuffle,
                                     &p->seed, &p->pad, &drop_last, a, b, c))
        return false;
    p->shuffle = shuffle;
    p->drop_last = drop_last;
    wh_err_t err = {0};
    if (!wh_plan_check(p, &err)) {
        wh_py_raise(S, &err);
        return false;
    }
    return true;
}

/* plan_info(plan...) -> dict of steps, rank_items, rank_batches, rank_pads. */
static PyObject *wh__plan_info(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    wh_plan_t p;
    if (!wh__parse_plan(S, args, kw, &p, NULL, NULL, NULL, NULL)) return NULL;
    return Py_BuildValue("{sKsKsKsK}", "steps", (unsigned long long)wh_plan_steps(&p), "rank_items",
                         (unsigned long long)wh_plan_rank_items(&p), "rank_batches",
                         (unsigned long long)(p.batch ? wh_plan_rank_batches(&p) : 0), "rank_pads",
                         (unsigned long long)wh_plan_rank_pads(&p));
}

/* plan_items(plan..., epoch=0, start=0, stop=all) -> PlanItems(positions: bytes of
 * int64, is_pad: bytes of uint8). */
static PyObject *wh__plan_items(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    wh_plan_t p;
    static const char *const names[] = {"epoch", "start", "stop", NULL};
    unsigned long long epoch = 0, start = 0, stop = UINT64_MAX;
    if (!wh__parse_plan(S, args, kw, &p, names, &epoch, &start, &stop)) return NULL;
    uint64_t steps = wh_plan_steps(&p);
    if (stop > steps) stop = steps;
    if (start > stop) start = stop;
    Py_ssize_t n = (Py_ssize_t)(stop - start);
    PyObject *pos = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *pad = PyBytes_FromStringAndSize(NULL, n);
    if (!pos || !pad) {
        Py_XDECREF(pos);
        Py_XDECREF(pad);
        return NULL;
    }
    int64_t *po = (int64_t *)PyBytes_AS_STRING(pos);
    char *pa = PyBytes_AS_STRING(pad);
    wh_plan_perm_t perm;
    wh_plan_perm_init(&perm, p.swap_cap, p.seed, epoch, p.shuffle);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t q;
        bool isp;
        wh_plan_item_at(&p, &perm, start + (uint64_t)i, &q, &isp);
        po[i] = q;
        pa[i] = isp;
    }
    return wh_py_record(S->rec_items, 2, pos, pad);
}

/* plan_resume(plan..., consumed=batches) -> PlanResume(role, step): the plan worker
 * this DataLoader worker plays for the rest of the epoch and its first step. */
static PyObject *wh__plan_resume(PyObject *m, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_mstate(m);
    wh_plan_t p;
    static const char *const names[] = {"consumed", NULL};
    unsigned long long consumed = 0;
    if (!wh__parse_plan(S, args, kw, &p, names, &consumed, NULL, NULL)) return NULL;
    uint32_t role;
    uint64_t step;
    wh_plan_resume(&p, consumed, &role, &step);
    return wh_py_record(S->rec_resume, 2, PyLong_FromUnsignedLong(role),
                        PyLong_FromUnsignedLongLong(step));
}

static PyMethodDef wh__plan_functions[] = {
    {"plan_info", (PyCFunction)(void (*)(void))wh__plan_info, METH_VARARGS | METH_KEYWORDS,
     "steps per worker, items and batches per rank"},
    {"plan_items", (PyCFunction)(void (*)(void))wh__plan_items, METH_VARARGS | METH_KEYWORDS,
     "PlanItems(positions, is_pad) of steps [start, stop) of an epoch"},
    {"plan_resume", (PyCFunction)(void (*)(void))wh__plan_resume, METH_VARARGS | METH_KEYWORDS,
     "PlanResume(role, step) of this DataLoader worker after the rank consumed `consumed` "
     "batches"},
    {NULL, NULL, 0, NULL},
};

static PyStructSequence_Field wh__items_fields[] = {
    {"positions", "bytes of int64: the position each step reads"},
    {"is_pad", "bytes of uint8: 1 where the step is padding"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__items_desc = {
    "wirehead_torch._C.PlanItems",
    "Steps of an epoch as plan_items gives them.",
    wh__items_fields,
    2,
};

static PyStructSequence_Field wh__resume_fields[] = {
    {"role", "the plan worker this DataLoader worker plays for the rest of the epoch"},
    {"step", "its first step"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__resume_desc = {
    "wirehead_torch._C.PlanResume",
    "Where a resumed DataLoader worker goes on (plan_resume).",
    wh__resume_fields,
    2,
};

int wh_py_plan_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_record(m, &S->rec_items, &wh__items_desc) < 0 ||
        wh_py_add_record(m, &S->rec_resume, &wh__resume_desc) < 0)
        return -1;
    return PyModule_AddFunctions(m, wh__plan_functions);
}
