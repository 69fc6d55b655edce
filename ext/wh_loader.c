/* Prefetching batch reader. Each ring slot is one wh_buf holding a whole
 * batch (every wanted field stacked, then is_pad, generation, position).
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
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* XXH3 with the widest SIMD the CPU has, chosen at run time */
#endif

#include "wh_shmfile.h"

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
} wh__lslot_t;

struct wh_loader {
    wh_loader_config_t cfg;
    char *uri, *dbname, *prefix;
    uint64_t refs; /* 1 for the owner + 1 per OUT slot */
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
    wh__lslot_t **slots;
    uint32_t nslots, cap_slots;
    wh_store_t *main_store;
    wh_loader_stats_t stats;
};

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
    free(ld);
}

static void wh__loader_unref(wh_loader_t *ld) {
    if (__atomic_sub_fetch(&ld->refs, 1, __ATOMIC_ACQ_REL) == 0) wh__loader_free(ld);
}

/* Last reference to a delivered batch went away: back to the ring. */
static void wh__slot_release(wh_buf_t *b) {
    wh__lslot_t *s = (wh__lslot_t *)b;
    wh_loader_t *ld = s->ld;
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
    wh__lslot_t *s;
    uint32_t i, n;
    const wh_read_at_t *at; /* the attempt in progress (for messages) */
} wh__fill_t;

static void wh__shape_str(const wh_field_meta_t *f, char *out, size_t cap) {
    size_t k = (size_t)snprintf(out, cap, "%s(", wh_dtype_name(f->dtype));
    for (int d = 0; d < f->ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, d ? ", %lld" : "%lld", (long long)f->shape[d]);
    if (k < cap) snprintf(out + k, cap - k, ")");
}

/* Lays out the batch from its first sample; grows the buffer if needed. */
static bool wh__layout(wh__fill_t *c, const wh_sample_meta_t *m, wh_err_t *err) {
    wh_loader_t *ld = c->ld;
    wh__lslot_t *s = c->s;
    uint64_t off = 0, n = c->n, part;
    for (int f = 0; f < m->nfields; f++) {
        s->b.meta[f] = m->f[f];
        s->b.off[f] = off;
        if (!(ld->cfg.want & (1u << f))) continue;
        if (!wh_mul_ok(m->f[f].nbytes, n, &part) || part > WH_SAMPLE_MAX_BYTES * 64 ||
            !wh_add_ok(off, WH_ALIGN_UP(part), &off))
            return wh_err_set(err, WH_E_INVALID, "batch size overflows");
    }
    s->b.pad_off = off;
    s->b.gen_off = off + WH_ALIGN_UP(n);
    s->b.pos_off = s->b.gen_off + WH_ALIGN_UP(8 * n);
    s->b.pv_off = s->b.pos_off + WH_ALIGN_UP(8 * n);
    uint64_t total = s->b.pv_off + WH_ALIGN_UP(8 * n);
    if (total > s->cap) {
        if (s->buf.data) ld->cfg.alloc.free(ld->cfg.alloc.ctx, s->buf.data, s->cap);
        s->buf.data = ld->cfg.alloc.alloc(ld->cfg.alloc.ctx, total);
        s->cap = s->buf.data ? total : 0;
        if (!s->buf.data)
            return wh_err_set(err, WH_E_SYS, "out of memory for a %llu-byte batch buffer",
                              (unsigned long long)total);
    }
    s->buf.size = total;
    return true;
}

static bool wh__dest(void *ctx, const wh_sample_meta_t *m, void **dst, wh_err_t *err) {
    wh__fill_t *c = ctx;
    wh__lslot_t *s = c->s;
    const wh_schema_t *schema = &c->ld->cfg.store.schema;
    if (c->i == 0) {
        if (!wh__layout(c, m, err)) return false;
    } else {
        for (int f = 0; f < m->nfields; f++) {
            if (!(c->ld->cfg.want & (1u << f)) || wh_field_meta_same(&m->f[f], &s->b.meta[f]))
                continue;
            char a[160], b[160];
            wh__shape_str(&m->f[f], a, sizeof a);
            wh__shape_str(&s->b.meta[f], b, sizeof b);
            return wh_err_set(err, WH_E_INVALID,
                              "field '%s': sample at position %u of generation %llu is %s but "
                              "the batch's first sample is %s; samples stacked in one batch "
                              "need one shape (use WireheadIterableDataset with a collate_fn "
                              "for ragged samples)",
                              schema->names[f], c->at->pos, (unsigned long long)c->at->gen, a, b);
        }
    }
    for (int f = 0; f < m->nfields; f++)
        if (c->ld->cfg.want & (1u << f))
            dst[f] = (char *)s->buf.data + s->b.off[f] + (uint64_t)c->i * m->f[f].nbytes;
    return true;
}

static bool wh__fill(wh_loader_t *ld, wh_store_t *st, wh__lslot_t *s, uint64_t index, uint64_t gen,
                     const wh_plan_perm_t *perm, wh_err_t *err) {
    uint64_t first = index * ld->cfg.batch;
    uint32_t n = (uint32_t)(ld->steps - first < ld->cfg.batch ? ld->steps - first : ld->cfg.batch);
    s->b.index = index;
    s->b.n = n;
    if (ld->cfg.refresh == WH_REFRESH_STEP) {
        uint64_t g = 0;
        if (wh_store_current(st, &g, NULL) && g > gen) gen = g;
    }
    wh_read_at_t at;
    wh__fill_t c = {ld, s, 0, n, &at};
    for (uint32_t i = 0; i < n; i++) {
        bool pad;
        memset(&at, 0, sizeof at);
        at.gen = gen;
        wh_plan_item_at(&ld->cfg.plan, perm, first + i, &at.pos, &pad);
        c.i = i;
        wh_sample_meta_t meta;
        bool ok =
            wh_store_read_sample(st, &at, ld->cfg.timeout_s, &ld->stop, wh__dest, &c, &meta, err);
        if (at.gone) __atomic_fetch_add(&ld->stats.gone, at.gone, __ATOMIC_RELAXED);
        if (at.corrupt || at.gen > gen) {
            pthread_mutex_lock(&ld->mu);
            ld->stats.corrupt += at.corrupt;
            if (at.corrupt) memcpy(ld->stats.last_skip, at.last_skip, sizeof at.last_skip);
            if (at.gen > ld->gen) ld->gen = at.gen;
            pthread_mutex_unlock(&ld->mu);
        }
        if (!ok) return wh_err_prefix(err, "batch %llu", (unsigned long long)index);
        gen = at.gen;
        pad = pad || at.pad;
        uint32_t pos = at.pos;
        char *base = s->buf.data;
        base[s->b.pad_off + i] = pad;
        int64_t g64 = (int64_t)gen, p64 = pos, v64 = (int64_t)meta.params_version;
        memcpy(base + s->b.gen_off + 8 * (uint64_t)i, &g64, 8);
        memcpy(base + s->b.pos_off + 8 * (uint64_t)i, &p64, 8);
        memcpy(base + s->b.pv_off + 8 * (uint64_t)i, &v64, 8);
    }
    __atomic_fetch_add(&ld->stats.items, n, __ATOMIC_RELAXED);
    return true;
}

static void *wh__worker(void *arg) {
    wh_loader_t *ld = arg;
    wh_err_t err = {0};
    wh_store_t *st = wh_store_open(&ld->cfg.store, &err);
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

bool wh_loader_start(wh_loader_t *ld, uint64_t epoch, uint64_t start_batch, uint64_t gen,
                     wh_err_t *err) {
    if (!gen) {
        uint64_t deadline = wh_now_mono_ns() + (uint64_t)(ld->cfg.timeout_s * 1e9);
        unsigned delay = 2;
        for (;;) {
            wh_err_t e = {0};
            if (!wh_store_current(ld->main_store, &gen, &e) && e.code != WH_E_UNAVAIL) {
                if (err) *err = e;
                return false;
            }
            if (gen) break;
            if (wh_now_mono_ns() > deadline)
                return wh_err_set(err, WH_E_TIMEOUT,
                                  "no generation sealed within %.0fs (READ_TIMEOUT); are "
                                  "generators and a manager running?",
                                  ld->cfg.timeout_s);
            wh_sleep_ms(delay);
            delay = delay < 100 ? delay * 2 : 100;
        }
    }
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
        if (ld->slots[i]->state == WH__READY) ld->slots[i]->state = WH__FREE;
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
    pthread_mutex_unlock(&ld->mu);
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

/* ---- the DataLoader workers' batch ring: shared maps, control words ---- */

bool wh_map_file(wh_map_t *m, const char *path, size_t size, int how, bool populate, bool hugepage,
                 bool *busy, wh_err_t *err) {
    m->base = NULL;
    m->size = 0;
    m->fd = -1;
    if (busy) *busy = false;
    if (strlen(path) >= sizeof m->path)
        return wh_err_set(err, WH_E_INVALID, "ring file path too long: %s", path);
    snprintf(m->path, sizeof m->path, "%s", path);
    if (size == 0) return wh_err_set(err, WH_E_INVALID, "ring file %s: size 0", path);
    int fd;
    if (how == WH_MAP_CREATE) {
        fd = wh_shmfile_create(path, size, err);
    } else if (how == WH_MAP_OPEN) {
        fd = wh_shmfile_open(path, size, err);
    } else {
        /* made empty, then locked, then reserved: whoever opens it meanwhile
         * finds it locked, or empty and free to reserve under its own lock */
        fd = wh_shmfile_create(path, 0, err);
        if (fd == -EEXIST) fd = wh_shmfile_open(path, 0, err);
    }
    if (fd < 0) return false;
    if (how == WH_MAP_REGION) {
        uint64_t have = 0;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK && busy) *busy = true;
            return wh_err_set(err, WH_E_SYS, "ring file %s: %s", path,
                              e == EWOULDBLOCK ? "held by another live process" : strerror(e));
        }
        if (!wh_shmfile_check(fd, path, 0, &have, err) ||
            (have == 0 && !wh_shmfile_reserve(fd, path, size, err))) {
            close(fd);
            return false;
        }
    }
    if (!wh_shmfile_check(fd, path, size, NULL, err)) {
        close(fd);
        return false;
    }
    void *p =
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return wh_err_set(err, WH_E_SYS, "ring file %s: mmap of %zu bytes: %s", path, size,
                          strerror(e));
    }
    if (hugepage) madvise(p, size, MADV_HUGEPAGE); /* advice only: shmem huge pages may be off */
    m->base = p;
    m->size = size;
    m->fd = fd;
    return true;
}

void wh_map_unlock(wh_map_t *m) {
    if (m->fd >= 0) flock(m->fd, LOCK_UN);
}

bool wh_map_intact(const wh_map_t *m, wh_err_t *err) {
    if (!m->base) return wh_err_set(err, WH_E_INVALID, "ring file %s: not mapped", m->path);
    return wh_shmfile_check(m->fd, m->path, m->size, NULL, err);
}

bool wh_map_hash(const wh_map_t *m, size_t off, size_t n, uint64_t *out, wh_err_t *err) {
    if (!wh_map_intact(m, err)) return false;
    if (off > m->size || n > m->size - off)
        return wh_err_set(err, WH_E_INVALID, "ring file %s: bytes %zu..%zu to check, %zu mapped",
                          m->path, off, off + n, m->size);
    *out = XXH3_64bits((const char *)m->base + off, n);
    return true;
}

void wh_map_close(wh_map_t *m) {
    if (m->base) munmap(m->base, m->size);
    if (m->fd >= 0) close(m->fd);
    m->base = NULL;
    m->size = 0;
    m->fd = -1;
}

static int64_t *wh__word(const wh_map_t *m, size_t i) { return (int64_t *)m->base + i; }

int64_t wh_word_load(const wh_map_t *m, size_t i) {
    return __atomic_load_n(wh__word(m, i), __ATOMIC_SEQ_CST);
}

void wh_word_store(const wh_map_t *m, size_t i, int64_t v) {
    __atomic_store_n(wh__word(m, i), v, __ATOMIC_SEQ_CST);
}

bool wh_word_cas(const wh_map_t *m, size_t i, int64_t expect, int64_t desired) {
    return __atomic_compare_exchange_n(wh__word(m, i), &expect, desired, false, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int64_t wh_word_add(const wh_map_t *m, size_t i, int64_t d) {
    return __atomic_add_fetch(wh__word(m, i), d, __ATOMIC_SEQ_CST);
}
