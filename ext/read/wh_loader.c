/* Prefetching batch reader. Each ring slot is one wh_buf holding a whole
 * batch, laid out and filled by wh_batch.c (the fill the DataLoader
 * workers' ring uses too).
 * Slot states: FREE -> FILLING (a thread owns it) -> READY -> OUT (handed
 * to the caller). An OUT slot comes back FREE when its last reference goes,
 * from whichever thread drops it; the loader itself lives until then. */
#define _GNU_SOURCE
#include "wh_loader.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    WH__FREE,
    WH__FILLING,
    WH__READY,
    WH__OUT
};

typedef struct wh__lslot {
    wh_buf_t buf; /* first member: the release callback casts back */
    struct wh_loader *ld;
    int state;
    uint64_t epoch_id;
    size_t cap;
    bool failed;
    wh_err_t err;
    wh_batch_t b;
    /* the registered path: the rows' store views, held until the slot is
     * free again (after the device copy from them) */
    wh_buf_t **views;
    const char **src;
    uint32_t nviews;
} wh__lslot_t;

struct wh_loader {
    wh_loader_config_t cfg;
    char *uri, *dbname, *prefix, *origin_id, *origin_name; /* the store's strings, owned */
    uint64_t refs;                                         /* 1 for the owner + 1 per OUT slot */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, ready_cv;
    pthread_t *threads;
    uint32_t nthreads;
    bool stop;
    bool fatal;
    wh_err_t fatal_err;
    /* the epoch */
    bool active;
    uint64_t epoch_id, epoch;
    wh_plan_perm_t perm;
    uint64_t steps, nbatches, next_assign, next_deliver;
    uint64_t gen, start_gen;
    uint64_t spec_gen; /* spec mode: what gen holds (wh_loader_set_spec) */
    wh__lslot_t **slots;
    uint32_t nslots, cap_slots;
    wh_store_t *main_store;
    wh_loader_stats_t stats;
    bool direct; /* atomic: fill for the registered path */
};

/* Lets go of a slot's store views (their pins). */
static void wh__slot_views_drop(wh__lslot_t *s) {
    for (uint32_t i = 0; i < s->nviews; i++) {
        wh_buf_unref(s->views[i]);
        s->views[i] = NULL;
    }
}

static void *wh__default_alloc(void *ctx, size_t size) {
    (void)ctx;
    void *p = aligned_alloc(WH_ALIGN, WH_ALIGN_UP(size ? size : 1));
    /* touch every page once now, so batches are not page-fault bound later */
    if (p) memset(p, 0, size);
    return p;
}

static void wh__default_free(void *ctx, void *p, size_t size) {
    (void)ctx;
    (void)size;
    free(p);
}

static void wh__loader_free(wh_loader_t *ld) {
    for (uint32_t i = 0; i < ld->nslots; i++) {
        wh__lslot_t *s = ld->slots[i];
        if (s->buf.data) ld->cfg.alloc.free(ld->cfg.alloc.ctx, s->buf.data, s->cap);
        wh__slot_views_drop(s);
        free(s->views);
        free(s->src);
        free(s);
    }
    free(ld->slots);
    free(ld->threads);
    wh_store_destroy(ld->main_store);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->work_cv);
    pthread_cond_destroy(&ld->ready_cv);
    free(ld->uri);
    free(ld->dbname);
    free(ld->prefix);
    free(ld->origin_id);
    free(ld->origin_name);
    free(ld);
}

static void wh__loader_unref(wh_loader_t *ld) {
    if (__atomic_sub_fetch(&ld->refs, 1, __ATOMIC_ACQ_REL) == 0) wh__loader_free(ld);
}

/* Last reference to a delivered batch went away: back to the ring. */
static void wh__slot_release(wh_buf_t *b) {
    wh__lslot_t *s = (wh__lslot_t *)b;
    wh_loader_t *ld = s->ld;
    wh__slot_views_drop(s); /* the slot is the releaser's alone until FREE */
    pthread_mutex_lock(&ld->mu);
    s->state = WH__FREE;
    s->buf.refs = 1;
    pthread_cond_broadcast(&ld->work_cv);
    pthread_mutex_unlock(&ld->mu);
    wh__loader_unref(ld);
}

/* New FREE slot; mutex held. */
static wh__lslot_t *wh__slot_add(wh_loader_t *ld) {
    if (ld->nslots == ld->cap_slots) {
        uint32_t nc = ld->cap_slots ? ld->cap_slots * 2 : 4;
        wh__lslot_t **ns = realloc(ld->slots, nc * sizeof *ns);
        if (!ns) return NULL;
        ld->slots = ns;
        ld->cap_slots = nc;
    }
    wh__lslot_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (ld->cfg.direct_min) {
        s->nviews = ld->cfg.batch;
        s->views = calloc(s->nviews, sizeof *s->views);
        s->src = calloc((size_t)s->nviews * WH_MAX_FIELDS, sizeof *s->src);
        if (!s->views || !s->src) {
            free(s->views);
            free(s->src);
            free(s);
            return NULL;
        }
    }
    s->ld = ld;
    s->buf.refs = 1;
    s->buf.device_type = 1;
    s->buf.release = wh__slot_release;
    s->buf.owner = ld;
    ld->slots[ld->nslots++] = s;
    ld->stats.ring = ld->nslots;
    return s;
}

static wh__lslot_t *wh__slot_free(wh_loader_t *ld) {
    for (uint32_t i = 0; i < ld->nslots; i++)
        if (ld->slots[i]->state == WH__FREE) return ld->slots[i];
    return NULL;
}

typedef struct {
    wh_loader_t *ld;
    const wh_plan_perm_t *perm;
    uint64_t first;
} wh__plan_at_t;

static void wh__plan_at(void *ctx, uint32_t i, uint32_t *pos, bool *pad) {
    wh__plan_at_t *c = ctx;
    wh_plan_item_at(&c->ld->cfg.plan, c->perm, c->first + i, pos, pad);
}

/* The slot's buffer, grown to the batch's size. */
static void *wh__slot_mem(void *ctx, const wh_batch_t *b, wh_err_t *err) {
    wh__lslot_t *s = ctx;
    wh_loader_t *ld = s->ld;
    if (b->hsize > s->cap) {
        if (s->buf.data) ld->cfg.alloc.free(ld->cfg.alloc.ctx, s->buf.data, s->cap);
        s->buf.data = ld->cfg.alloc.alloc(ld->cfg.alloc.ctx, b->hsize);
        uint64_t had = s->cap;
        s->cap = s->buf.data ? b->hsize : 0;
        __atomic_fetch_add(&ld->stats.ring_bytes, s->cap - had, __ATOMIC_RELAXED);
        if (!s->buf.data)
            return wh_err_set(err, WH_E_SYS, "out of memory for a %llu-byte batch buffer",
                              (unsigned long long)b->hsize),
                   NULL;
    }
    s->buf.size = b->hsize;
    return s->buf.data;
}

static bool wh__fill(wh_loader_t *ld, wh_store_t *st, wh__lslot_t *s, uint64_t index, uint64_t gen,
                     const wh_plan_perm_t *perm, wh_err_t *err) {
    uint64_t first = index * ld->cfg.batch;
    uint32_t n = (uint32_t)(ld->steps - first < ld->cfg.batch ? ld->steps - first : ld->cfg.batch);
    if (ld->cfg.refresh == WH_REFRESH_STEP) {
        uint64_t g = 0;
        if (wh_store_current(st, &g, NULL) && g > gen) gen = g;
    }
    wh__plan_at_t pc = {ld, perm, first};
    wh_batch_fill_t rq = {.st = st,
                          .schema = &ld->cfg.store.schema,
                          .n = n,
                          .want = ld->cfg.want,
                          .timeout_s = ld->cfg.timeout_s,
                          .stop = &ld->stop,
                          .at = wh__plan_at,
                          .at_ctx = &pc,
                          .mem = wh__slot_mem,
                          .mem_ctx = s,
                          .exact = ld->cfg.store.spec,
                          .spec_gen = ld->spec_gen};
    wh__slot_views_drop(s);
    if (s->views && __atomic_load_n(&ld->direct, __ATOMIC_ACQUIRE)) {
        rq.views = s->views;
        rq.src = s->src;
        rq.direct_min = ld->cfg.direct_min;
    }
    wh_batch_stats_t bs;
    void *data;
    bool ok = wh_batch_fill(&rq, gen, &s->b, &data, &bs, err);
    s->b.index = index;
    if (bs.gone) __atomic_fetch_add(&ld->stats.gone, bs.gone, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ld->stats.host_bytes, bs.host_bytes, __ATOMIC_RELAXED);
    if (!ok) wh__slot_views_drop(s);
    if (bs.corrupt || bs.gen > gen) {
        pthread_mutex_lock(&ld->mu);
        ld->stats.corrupt += bs.corrupt;
        if (bs.corrupt) memcpy(ld->stats.last_skip, bs.last_skip, sizeof bs.last_skip);
        if (bs.gen > ld->gen) ld->gen = bs.gen;
        pthread_mutex_unlock(&ld->mu);
    }
    if (!ok) return wh_err_prefix(err, "batch %llu", (unsigned long long)index);
    __atomic_fetch_add(&ld->stats.items, n, __ATOMIC_RELAXED);
    return true;
}

static void *wh__worker(void *arg) {
    wh_loader_t *ld = arg;
    wh_err_t err = {0};
    wh_store_t *st = wh_store_open(&ld->cfg.store, &err);
    if (st && ld->cfg.direct_min) wh_store_set_dma_views(st, true);
    pthread_mutex_lock(&ld->mu);
    if (!st) {
        if (!ld->fatal) {
            ld->fatal = true;
            ld->fatal_err = err;
        }
        pthread_cond_broadcast(&ld->ready_cv);
        pthread_mutex_unlock(&ld->mu);
        return NULL;
    }
    for (;;) {
        wh__lslot_t *s = NULL;
        while (!ld->stop &&
               !(ld->active && ld->next_assign < ld->nbatches && (s = wh__slot_free(ld))))
            pthread_cond_wait(&ld->work_cv, &ld->mu);
        if (ld->stop) break;
        s->state = WH__FILLING;
        s->epoch_id = ld->epoch_id;
        uint64_t index = ld->next_assign++, gen = ld->gen;
        wh_plan_perm_t perm = ld->perm;
        pthread_mutex_unlock(&ld->mu);
        wh_err_t e = {0};
        bool ok = wh__fill(ld, st, s, index, gen, &perm, &e);
        pthread_mutex_lock(&ld->mu);
        if (s->epoch_id != ld->epoch_id) {
            wh__slot_views_drop(s);
            s->state = WH__FREE; /* the epoch was restarted meanwhile */
            pthread_cond_broadcast(&ld->work_cv);
        } else {
            s->state = WH__READY;
            s->failed = !ok;
            s->err = e;
        }
        pthread_cond_broadcast(&ld->ready_cv);
    }
    pthread_mutex_unlock(&ld->mu);
    wh_store_destroy(st);
    return NULL;
}

static char *wh__dup(const char *s) { return s ? strdup(s) : NULL; }

wh_loader_t *wh_loader_new(const wh_loader_config_t *cfg, wh_err_t *err) {
    if (cfg->batch < 1 || cfg->threads < 1 || cfg->prefetch < 1 || cfg->threads > 256)
        return wh_err_set(err, WH_E_INVALID,
                          "batch_size, num_threads (1..256) and prefetch must "
                          "be at least 1"),
               NULL;
    if (!cfg->want) return wh_err_set(err, WH_E_INVALID, "no fields selected"), NULL;
    wh_plan_t plan = cfg->plan;
    plan.workers = 0;
    plan.worker = 0;
    if (!wh_plan_check(&plan, err)) return NULL;
    wh_loader_t *ld = calloc(1, sizeof *ld);
    if (!ld) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    ld->cfg = *cfg;
    ld->cfg.plan = plan;
    if (!ld->cfg.alloc.alloc) {
        ld->cfg.alloc.alloc = wh__default_alloc;
        ld->cfg.alloc.free = wh__default_free;
    }
    ld->uri = wh__dup(cfg->store.uri);
    ld->dbname = wh__dup(cfg->store.dbname);
    ld->prefix = wh__dup(cfg->store.prefix);
    ld->cfg.store.uri = ld->uri;
    ld->cfg.store.dbname = ld->dbname;
    ld->cfg.store.prefix = ld->prefix;
    ld->origin_id = wh__dup(cfg->store.origin_id);
    ld->origin_name = wh__dup(cfg->store.origin_name);
    ld->cfg.store.origin_id = ld->origin_id;
    ld->cfg.store.origin_name = ld->origin_name;
    ld->refs = 1;
    pthread_mutex_init(&ld->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ld->work_cv, &ca);
    pthread_cond_init(&ld->ready_cv, &ca);
    pthread_condattr_destroy(&ca);
    ld->steps = wh_plan_steps(&ld->cfg.plan);
    ld->nbatches =
        cfg->drop_last ? ld->steps / cfg->batch : (ld->steps + cfg->batch - 1) / cfg->batch;
    ld->direct = cfg->direct_min > 0;
    ld->main_store = wh_store_open(&ld->cfg.store, err);
    if (!ld->main_store) {
        wh__loader_free(ld);
        return NULL;
    }
    for (uint32_t i = 0; i < cfg->prefetch + 1; i++) {
        if (!wh__slot_add(ld)) {
            wh__loader_free(ld);
            return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
        }
    }
    ld->threads = calloc(cfg->threads, sizeof *ld->threads);
    if (!ld->threads) {
        wh__loader_free(ld);
        return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    }
    for (uint32_t i = 0; i < cfg->threads; i++) {
        int r = pthread_create(&ld->threads[i], NULL, wh__worker, ld);
        if (r) {
            wh_err_set(err, WH_E_SYS, "cannot start reader thread: %s", strerror(r));
            wh_loader_destroy(ld);
            return NULL;
        }
        ld->nthreads++;
    }
    return ld;
}

uint64_t wh_loader_batches(const wh_loader_t *ld) { return ld->nbatches; }
uint64_t wh_loader_items(const wh_loader_t *ld) { return ld->steps; }
uint64_t wh_loader_generation(const wh_loader_t *ld) { return ld->start_gen; }

void wh_loader_set_spec(wh_loader_t *ld, uint64_t spec_gen) {
    pthread_mutex_lock(&ld->mu);
    ld->spec_gen = spec_gen;
    pthread_mutex_unlock(&ld->mu);
}

bool wh_loader_start(wh_loader_t *ld, uint64_t epoch, uint64_t start_batch, uint64_t gen,
                     wh_err_t *err) {
    /* the store's one wait for a generation (the Python loader has waited
     * already, and passes the one it found) */
    if (!gen && !wh_store_wait_gen(ld->main_store, 0, ld->cfg.timeout_s, &ld->stop, &gen, err))
        return false;
    pthread_mutex_lock(&ld->mu);
    ld->epoch_id++;
    ld->epoch = epoch;
    wh_plan_perm_init(&ld->perm, ld->cfg.store.swap_cap, ld->cfg.plan.seed, epoch,
                      ld->cfg.plan.shuffle);
    if (start_batch > ld->nbatches) start_batch = ld->nbatches;
    ld->next_assign = ld->next_deliver = start_batch;
    ld->gen = ld->start_gen = gen;
    ld->active = true;
    for (uint32_t i = 0; i < ld->nslots; i++)
        if (ld->slots[i]->state == WH__READY) {
            wh__slot_views_drop(ld->slots[i]);
            ld->slots[i]->state = WH__FREE;
        }
    pthread_cond_broadcast(&ld->work_cv);
    pthread_mutex_unlock(&ld->mu);
    return true;
}

bool wh_loader_next(wh_loader_t *ld, unsigned wait_ms, wh_batch_t *out, bool *done, wh_err_t *err) {
    *done = false;
    out->buf = NULL;
    uint64_t t0 = wh_now_mono_ns();
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += wait_ms / 1000;
    until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    bool ok = true;
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        if (ld->fatal) {
            if (err) *err = ld->fatal_err;
            ok = false;
            break;
        }
        if (!ld->active || ld->next_deliver >= ld->nbatches) {
            *done = true;
            ld->active = false;
            break;
        }
        wh__lslot_t *ready = NULL;
        for (uint32_t i = 0; i < ld->nslots; i++) {
            wh__lslot_t *s = ld->slots[i];
            if (s->state == WH__READY && s->epoch_id == ld->epoch_id &&
                s->b.index == ld->next_deliver)
                ready = s;
        }
        if (ready) {
            ld->next_deliver++;
            if (ready->failed) {
                wh__slot_views_drop(ready);
                ready->state = WH__FREE;
                if (err) *err = ready->err;
                ld->active = false; /* the epoch cannot go on past a failed batch */
                pthread_cond_broadcast(&ld->work_cv);
                ok = false;
                break;
            }
            ready->state = WH__OUT;
            __atomic_fetch_add(&ld->refs, 1, __ATOMIC_RELAXED);
            *out = ready->b;
            out->buf = &ready->buf; /* the loader's reference passes to the caller */
            ld->stats.batches++;
            break;
        }
        /* every ring buffer is held by the caller's tensors: add one */
        if (ld->next_assign == ld->next_deliver && !wh__slot_free(ld)) {
            if (!wh__slot_add(ld)) {
                ok = wh_err_set(err, WH_E_SYS, "out of memory for a ring buffer");
                break;
            }
            pthread_cond_broadcast(&ld->work_cv);
        }
        if (pthread_cond_timedwait(&ld->ready_cv, &ld->mu, &until) == ETIMEDOUT) break;
    }
    ld->stats.wait_ns += wh_now_mono_ns() - t0;
    pthread_mutex_unlock(&ld->mu);
    return ok;
}

void wh_loader_stats(wh_loader_t *ld, wh_loader_stats_t *out) {
    pthread_mutex_lock(&ld->mu);
    *out = ld->stats;
    out->items = __atomic_load_n(&ld->stats.items, __ATOMIC_RELAXED);
    out->gone = __atomic_load_n(&ld->stats.gone, __ATOMIC_RELAXED);
    out->host_bytes = __atomic_load_n(&ld->stats.host_bytes, __ATOMIC_RELAXED);
    out->ring_bytes = __atomic_load_n(&ld->stats.ring_bytes, __ATOMIC_RELAXED);
    out->direct = __atomic_load_n(&ld->direct, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&ld->mu);
}

void wh_loader_stage_all(wh_loader_t *ld) {
    __atomic_store_n(&ld->direct, false, __ATOMIC_RELEASE);
}

void wh_loader_destroy(wh_loader_t *ld) {
    if (!ld) return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    ld->active = false;
    pthread_cond_broadcast(&ld->work_cv);
    pthread_mutex_unlock(&ld->mu);
    for (uint32_t i = 0; i < ld->nthreads; i++) pthread_join(ld->threads[i], NULL);
    ld->nthreads = 0;
    wh__loader_unref(ld);
}
