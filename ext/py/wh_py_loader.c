/* wirehead_torch._C.Loader: WireheadLoader's C reader threads and batch
 * ring (wh_loader.c), with an optional GPU stage feeding device batches. */
#include "wh_py.h"

#include <string.h>
#include <unistd.h>

#include "wh_dlpack.h"
#include "wh_loader.h"

typedef struct {
    PyObject_HEAD wh_loader_t *ld;
    pthread_mutex_t mu;
    long pid;
    uint32_t want;
    int nfields;
    bool inited;
    wh_gpu_t *gpu;       /* device=N: the GPU stage, */
    wh_gpu_feed_t *feed; /* and batches copied ahead */
} wh__pyloader_t;

/* device=N: batch memory is page-locked and a GPU stage copies it. */
static void wh__loader_gpu_new(wh__pyloader_t *self, wh_loader_config_t *lc, int device,
                               wh_err_t *err) {
    self->gpu = wh_gpu_new(device, err);
    if (!self->gpu) return;
    lc->alloc.alloc = wh_cuda_host_alloc;
    lc->alloc.free = wh_cuda_host_free;
    lc->alloc.ctx = (void *)(intptr_t)device;
    char why[WH_ERR_LEN];
    if (!wh_py_gpu_direct_min(lc->store.uri, &lc->direct_min, why, sizeof why, err)) {
        wh_gpu_destroy(self->gpu);
        self->gpu = NULL;
        return;
    }
    if (!lc->direct_min) wh_gpu_set_staged(self->gpu, why);
}

static int wh__loader_init(wh__pyloader_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"store",   "batch",     "threads", "prefetch", "drop_last",   "world",
                             "rank",    "shuffle",   "seed",    "pad",      "pad_batches", "want",
                             "refresh", "timeout_s", "device",  NULL};
    PyObject *store, *want;
    uint32_t batch, threads, prefetch, world, rank;
    int drop_last, shuffle, pad, pad_batches, refresh;
    unsigned long long seed;
    double timeout_s;
    int device = -1;
    if (self->inited) {
        PyErr_SetString(PyExc_RuntimeError, "Loader already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!O&O&O&pO&O&pKipOid|i", kwlist, &PyDict_Type, &store, wh_py_u32, &batch,
            wh_py_u32, &threads, wh_py_u32, &prefetch, &drop_last, wh_py_u32, &world, wh_py_u32,
            &rank, &shuffle, &seed, &pad, &pad_batches, &want, &refresh, &timeout_s, &device))
        return -1;
    if (!(timeout_s > 0 && timeout_s < WH_SECONDS_MAX)) {
        PyErr_Format(S->value, "READ_TIMEOUT must be a positive number of seconds below %.0f",
                     WH_SECONDS_MAX);
        return -1;
    }
    PyObject *empty = PyTuple_New(0);
    if (!empty) return -1;
    wh_py_cfgbuf_t cb;
    bool parsed = wh_py_parse_cfg(S, empty, store, &cb);
    Py_DECREF(empty);
    if (!parsed) return -1;
    wh_loader_config_t lc;
    memset(&lc, 0, sizeof lc);
    lc.store = cb.cfg;
    lc.plan.swap_cap = cb.cfg.swap_cap;
    lc.plan.world = world;
    lc.plan.rank = rank;
    lc.plan.batch = pad_batches ? batch : 0;
    lc.plan.shuffle = shuffle;
    lc.plan.seed = seed;
    lc.plan.pad = pad;
    lc.plan.drop_last = drop_last;
    lc.batch = batch;
    lc.threads = threads;
    lc.prefetch = prefetch;
    lc.drop_last = drop_last;
    lc.refresh = refresh;
    lc.timeout_s = timeout_s;
    PyObject *seq = PySequence_Fast(want, "want must be a sequence of field indices");
    if (!seq) {
        Py_DECREF(cb.keep);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long k = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (k < 0 || k >= cb.cfg.schema.nfields) {
            if (!PyErr_Occurred()) PyErr_Format(S->value, "field index %ld out of range", k);
            Py_DECREF(seq);
            Py_DECREF(cb.keep);
            return -1;
        }
        lc.want |= 1u << k;
    }
    Py_DECREF(seq);
    wh_err_t err = {0};
    wh_loader_t *ld = NULL;
    Py_BEGIN_ALLOW_THREADS if (device >= 0) wh__loader_gpu_new(self, &lc, device, &err);
    if (device < 0 || self->gpu) ld = wh_loader_new(&lc, &err);
    if (ld && self->gpu && !(self->feed = wh_gpu_feed_new(self->gpu, ld, prefetch, &err))) {
        wh_loader_destroy(ld);
        ld = NULL;
    }
    if (!ld) {
        wh_gpu_destroy(self->gpu);
        self->gpu = NULL;
    }
    Py_END_ALLOW_THREADS Py_DECREF(cb.keep);
    if (!ld) {
        wh_py_raise(S, &err);
        return -1;
    }
    pthread_mutex_init(&self->mu, NULL);
    self->ld = ld;
    self->inited = true;
    self->pid = (long)getpid();
    self->want = lc.want;
    self->nfields = cb.cfg.schema.nfields;
    return 0;
}

static void wh__loader_close_ld(wh__pyloader_t *self) {
    if (!self->inited) return;
    if ((long)getpid() != self->pid) { /* threads did not cross the fork */
        self->ld = NULL;
        self->feed = NULL;
        self->gpu = NULL;
        return;
    }
    wh_loader_t *ld;
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->mu); /* waits for a call in another thread */
    ld = self->ld;
    self->ld = NULL;
    pthread_mutex_unlock(&self->mu);
    wh_gpu_feed_destroy(self->feed);
    wh_gpu_destroy(self->gpu);
    self->feed = NULL;
    self->gpu = NULL;
    wh_loader_destroy(ld);
    Py_END_ALLOW_THREADS
}

static void wh__loader_dealloc(wh__pyloader_t *self) {
    PyTypeObject *tp = Py_TYPE(self);
    wh__loader_close_ld(self);
    if (self->inited) pthread_mutex_destroy(&self->mu);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static bool wh__loader_ok(wh__pyloader_t *self) {
    wh_py_state_t *S = wh_py_tstate(self);
    if (!self->ld) {
        PyErr_SetString(S->value, "loader is closed");
        return false;
    }
    if ((long)getpid() != self->pid) {
        PyErr_SetString(S->value, "a WireheadLoader cannot be used after fork; make it "
                                  "in the process that iterates");
        return false;
    }
    return true;
}

static PyObject *wh__loader_start(wh__pyloader_t *self, PyObject *args, PyObject *kw) {
    wh_py_state_t *S = wh_py_tstate(self);
    static char *kwlist[] = {"epoch", "start", "generation", "spec_gen", NULL};
    unsigned long long epoch, start, gen, spec_gen = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKK|$K", kwlist, &epoch, &start, &gen, &spec_gen) ||
        !wh__loader_ok(self))
        return NULL;
    wh_err_t err = {0};
    bool ok;
    WH_PY_CALL(self, ld, ok, &err,
               (self->feed ? wh_gpu_feed_reset(self->feed) : (void)0,
                wh_loader_set_spec(self->ld, spec_gen),
                wh_loader_start(self->ld, epoch, start, gen, &err)));
    if (!ok) return wh_py_raise(S, &err);
    Py_RETURN_NONE;
}

static PyObject *wh__loader_next(wh__pyloader_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__loader_ok(self)) return NULL;
    wh_batch_t b;
    bool ok, done, any_pad = false;
    wh_err_t err = {0};
    for (;;) {
        WH_PY_CALL(self, ld, ok, &err,
                   self->feed ? wh_gpu_feed_next(self->feed, 100, &b, &done, &any_pad, &err)
                              : wh_loader_next(self->ld, 100, &b, &done, &err));
        if (!ok) return wh_py_raise(S, &err);
        if (done) Py_RETURN_NONE;
        if (b.buf) break;
        if (PyErr_CheckSignals() < 0) return NULL; /* Ctrl-C while waiting */
    }
    PyObject *fields = PyList_New(self->nfields), *res = NULL;
    for (int f = 0; fields && f < self->nfields; f++) {
        PyObject *a = Py_None;
        if (self->want & (1u << f)) {
            int64_t shape[WH_MAX_NDIM + 1];
            shape[0] = b.n;
            for (int d = 0; d < b.meta[f].ndim; d++) shape[d + 1] = b.meta[f].shape[d];
            a = wh_array_new(S->array, b.buf, b.off[f], b.meta[f].dtype, b.meta[f].ndim + 1, shape);
        } else {
            Py_INCREF(a);
        }
        wh_py_list_put(&fields, f, a);
    }
    int64_t n = b.n;
    PyObject *pad = fields ? wh_array_new(S->array, b.buf, b.pad_off, WH_DT_BOOL, 1, &n) : NULL;
    PyObject *gen = pad ? wh_array_new(S->array, b.buf, b.gen_off, WH_DT_I64, 1, &n) : NULL;
    PyObject *pos = gen ? wh_array_new(S->array, b.buf, b.pos_off, WH_DT_I64, 1, &n) : NULL;
    PyObject *pv = pos ? wh_array_new(S->array, b.buf, b.pv_off, WH_DT_I64, 1, &n) : NULL;
    if (pv) {
        /* device batches: whether padding is in, known on the host */
        PyObject *anyp = self->feed ? PyBool_FromLong(any_pad) : Py_None;
        if (!self->feed) Py_INCREF(anyp);
        res = wh_py_record(S->rec_batch, 7, fields, pad, gen, pos, pv,
                           PyLong_FromUnsignedLongLong(b.index), anyp);
    } else {
        Py_XDECREF(fields);
        Py_XDECREF(pad);
        Py_XDECREF(gen);
        Py_XDECREF(pos);
    }
    wh_buf_unref(b.buf); /* arrays hold their own references now */
    return res;
}

/* Under the handle's lock: a close in another thread frees the GPU stage. */
static bool wh__loader_stats_locked(wh_loader_t *ld, wh_gpu_t *gpu, wh_loader_stats_t *st,
                                    wh_gpu_stats_t *gst, uint64_t *sizes) {
    wh_loader_stats(ld, st);
    if (gpu) wh_gpu_stats(gpu, gst);
    sizes[0] = wh_loader_batches(ld);
    sizes[1] = wh_loader_items(ld);
    sizes[2] = wh_loader_generation(ld);
    return true;
}

static PyObject *wh__loader_info(wh__pyloader_t *self, PyObject *unused) {
    wh_py_state_t *S = wh_py_tstate(self);
    (void)unused;
    if (!wh__loader_ok(self)) return NULL;
    wh_loader_stats_t st;
    memset(&st, 0, sizeof st);
    uint64_t sz[3] = {0, 0, 0};
    wh_err_t err = {0};
    bool ok;
    wh_gpu_stats_t gst;
    memset(&gst, 0, sizeof gst);
    bool gpu = self->gpu != NULL;
    WH_PY_CALL(self, ld, ok, &err, wh__loader_stats_locked(self->ld, self->gpu, &st, &gst, sz));
    if (!ok) return wh_py_raise(S, &err);
    PyObject *d = Py_BuildValue(
        "{sKsKsKsKsKsKsdsIsKsKss}", "batches_per_epoch", (unsigned long long)sz[0],
        "items_per_epoch", (unsigned long long)sz[1], "batches", (unsigned long long)st.batches,
        "items", (unsigned long long)st.items, "corrupt", (unsigned long long)st.corrupt, "gone",
        (unsigned long long)st.gone, "wait_s", (double)st.wait_ns / 1e9, "ring", st.ring,
        "ring_bytes", (unsigned long long)st.ring_bytes, "generation", (unsigned long long)sz[2],
        "last_skip", st.last_skip);
    if (d && gpu && wh_py_gpu_stats_into(d, &gst) < 0) Py_CLEAR(d);
    if (d && gpu) { /* which path the batches took, and the host copies */
        PyObject *x = PyLong_FromUnsignedLongLong(st.host_bytes);
        PyObject *hc = x ? PyDict_GetItemString(d, "host_copy_bytes") : NULL;
        PyObject *sum = hc ? PyNumber_Add(hc, x) : NULL;
        PyObject *path = PyUnicode_FromString(st.direct ? "registered" : "staged");
        Py_XDECREF(x);
        if (!sum || !path || PyDict_SetItemString(d, "host_copy_bytes", sum) < 0 ||
            PyDict_SetItemString(d, "path", path) < 0)
            Py_CLEAR(d);
        Py_XDECREF(sum);
        Py_XDECREF(path);
    }
    return d;
}

static PyObject *wh__loader_close(wh__pyloader_t *self, PyObject *unused) {
    (void)unused;
    wh__loader_close_ld(self);
    Py_RETURN_NONE;
}

static PyMethodDef wh__loader_methods[] = {
    {"start", (PyCFunction)(void (*)(void))wh__loader_start, METH_VARARGS | METH_KEYWORDS,
     "start(epoch, start_batch, generation, *, spec_gen=0): begin an epoch (generation 0: "
     "newest; spec mode: generation holds spec generation spec_gen)"},
    {"next", (PyCFunction)wh__loader_next, METH_NOARGS,
     "next batch: LoaderBatch(fields, is_pad, generation, position, batch_index, any_pad), or None "
     "at the epoch's end"},
    {"info", (PyCFunction)wh__loader_info, METH_NOARGS, "sizes and counters"},
    {"close", (PyCFunction)wh__loader_close, METH_NOARGS, "stop the reader threads"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot wh__loader_slots[] = {
    {Py_tp_init, wh__loader_init},
    {Py_tp_dealloc, wh__loader_dealloc},
    {Py_tp_methods, wh__loader_methods},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_doc, "C batch reader (threads, ring of batch buffers)."},
    {0, NULL},
};

static PyType_Spec wh__loader_spec = {
    "wirehead_torch._C.Loader", sizeof(wh__pyloader_t), 0, Py_TPFLAGS_DEFAULT, wh__loader_slots,
};

static PyStructSequence_Field wh__batch_fields[] = {
    {"fields", "one Array per stored field, the batch as its first dim; None for a field not "
               "wanted"},
    {"is_pad", "bool Array: which rows are padding"},
    {"generation", "int64 Array: the generation each row was read from"},
    {"position", "int64 Array: the position each row was read from"},
    {"params_version", "int64 Array: the params version each row was made under"},
    {"batch_index", "the batch's index in its epoch"},
    {"any_pad", "whether any row is padding, known on the host for device batches; None for "
                "host batches (read is_pad)"},
    {NULL, NULL},
};

static PyStructSequence_Desc wh__batch_desc = {
    "wirehead_torch._C.LoaderBatch",
    "A batch as Loader.next gives it.",
    wh__batch_fields,
    7,
};

int wh_py_loader_exec(PyObject *m, wh_py_state_t *S) {
    if (wh_py_add_type(m, &S->loader, &wh__loader_spec) < 0) return -1;
    return wh_py_add_record(m, &S->rec_batch, &wh__batch_desc);
}
