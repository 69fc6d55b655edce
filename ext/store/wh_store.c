/* The store's dispatch: a handle's calls through its backend's operation
 * table (opened through the scheme table, wh_scheme.c), the one read policy
 * every reader uses, and the params calls. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "wh_guard.h"
#include "wh_store_int.h"

const wh_store_config_t *wh_store_config(const wh_store_t *st) { return &st->cfg; }

static bool wh__params_filter_gen(wh_store_t *st, uint64_t *gen, wh_err_t *err);

bool wh_store_here(const wh_store_t *st, wh_err_t *err) {
    wh_guard_ensure(); /* every store call may touch a shared mapping */
    if (getpid() != st->pid)
        return wh_err_set(err, WH_E_INVALID, "store handle used after fork; open it in the child");
    return true;
}

wh_store_t *wh_store_open(const wh_store_config_t *cfg, wh_err_t *err) {
    if (!cfg->uri) return wh_err_set(err, WH_E_INVALID, "no store URI"), NULL;
    if (!wh_swap_cap_check(cfg->swap_cap, "SWAP_CAP", err)) return NULL;
    const wh_store_ops_t *ops = wh_scheme_ops(cfg->uri, err);
    if (!ops) return NULL;
    wh_store_t *st = ops->open(cfg, err);
    if (!st) return NULL;
    st->pid = (int)getpid();
    memset(&st->beat, 0, sizeof st->beat);
    if (getrandom(&st->beat.token, sizeof st->beat.token, 0) != sizeof st->beat.token)
        st->beat.token = wh_now_real_ns() ^ ((uint64_t)st->pid << 40) ^ (uint64_t)(uintptr_t)st;
    st->beat.token |= 1; /* 0 marks a free heartbeat entry */
    st->beat.pid = st->pid;
    st->min_params = cfg->min_params;
    /* the caller's strings need not outlive the call */
    st->uri = strdup(cfg->uri);
    st->cfg.uri = st->uri;
    st->cfg.dbname = NULL;
    st->cfg.prefix = NULL;
    st->cfg.origin_id = NULL;
    st->cfg.origin_name = NULL;
    if (!st->uri) {
        st->ops->destroy(st);
        return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    }
    return st;
}

void wh_store_destroy(wh_store_t *st) {
    if (!st) return;
    free(st->uri);
    st->ops->destroy(st);
}

bool wh_store_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                  wh_put_status_t *status, uint64_t *gen, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (st->cfg.spec)
        return wh_err_set(err, WH_E_INVALID,
                          "store %s is in spec mode (RUN_SEED=%llu): its generators put through "
                          "claims, as WireheadGenerator(fn) does with a function of a wt.Spec",
                          st->uri, (unsigned long long)st->cfg.run_seed);
    return st->ops->put(st, arr, n, wait_ms, status, gen, err);
}

bool wh_store_lead(wh_store_t *st, bool *leader, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->lead(st, leader, err);
}

bool wh_store_resign(wh_store_t *st, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->resign(st, err);
}

bool wh_store_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->seal(st, sealed, info, err);
}

bool wh_store_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->current(st, gen, err) && wh__params_filter_gen(st, gen, err);
}

bool wh_store_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                   wh_sample_meta_t *meta, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (!wh_store_pos_check(st, pos, err)) return false;
    if (!st->ops->read(st, gen, pos, fn, ctx, meta, err)) return false;
    if (meta) st->last_params = meta->params_version;
    return true;
}

bool wh_store_status(wh_store_t *st, wh_status_t *out, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->status(st, out, err);
}

bool wh_store_wait_gen(wh_store_t *st, uint64_t newer_than, double timeout_s, const bool *stop,
                       uint64_t *gen, wh_err_t *err) {
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)(timeout_s > 0 ? timeout_s * 1e9 : 0);
    unsigned delay = WH_READ_BACKOFF_MIN_MS;
    for (;;) {
        uint64_t g = 0;
        wh_err_t e = {0};
        bool ok = wh_store_current(st, &g, &e);
        if (ok && g && g != newer_than) {
            *gen = g;
            return true;
        }
        if (!ok && e.code != WH_E_UNAVAIL) {
            if (err) *err = e;
            return false;
        }
        if (wh_now_mono_ns() >= deadline || (stop && __atomic_load_n(stop, __ATOMIC_RELAXED))) {
            if (!ok) {
                if (err) *err = e;
            } else if (st->min_params) {
                wh_gen_params_t gp = {0};
                uint64_t rg = 0;
                wh_err_t ge = {0};
                if (st->ops->current(st, &rg, &ge) && rg) wh_store_gen_params(st, rg, &gp, &ge);
                wh_err_set(err, WH_E_TIMEOUT,
                           "no generation made entirely under params version >= %llu within %gs "
                           "(the read generation %llu was made under versions %llu..%llu)",
                           (unsigned long long)st->min_params, timeout_s, (unsigned long long)rg,
                           (unsigned long long)gp.min, (unsigned long long)gp.max);
            } else if (newer_than) {
                wh_err_set(err, WH_E_TIMEOUT,
                           "generation %llu is gone and no newer one appeared within %gs",
                           (unsigned long long)newer_than, timeout_s);
            } else {
                wh_status_t s;
                wh_err_t se = {0};
                if (!wh_store_status(st, &s, &se) && se.code == WH_E_NOSTORE)
                    wh_err_set(err, WH_E_TIMEOUT, "no generation sealed within %gs: %s", timeout_s,
                               se.message);
                else
                    wh_err_set(err, WH_E_TIMEOUT, "no generation sealed within %gs", timeout_s);
            }
            return false;
        }
        wh_sleep_ms(delay); /* bounded poll: a store has no wake-up channel across processes */
        delay = delay * 2 < WH_READ_BACKOFF_MAX_MS ? delay * 2 : WH_READ_BACKOFF_MAX_MS;
    }
}

bool wh_store_view(wh_store_t *st, uint64_t gen, uint32_t pos, wh_buf_t **out,
                   wh_sample_meta_t *meta, wh_err_t *err) {
    return wh_store_view_known(st, gen, pos, NULL, out, meta, err);
}

bool wh_store_view_known(wh_store_t *st, uint64_t gen, uint32_t pos, const uint64_t *known,
                         wh_buf_t **out, wh_sample_meta_t *meta, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (!st->ops->view) return wh_store_lacks(st, WH_CAP_VIEWS, "store-backed views", err);
    if (!wh_store_pos_check(st, pos, err)) return false;
    return st->ops->view(st, gen, pos, known, out, meta, err);
}

void wh_store_set_dma_views(wh_store_t *st, bool on) {
    if (st->ops->set_dma_views) st->ops->set_dma_views(st, on);
}

/* One attempt of the read policy: a copy (read) or a view. */
typedef struct {
    wh_dest_fn fn;
    void *ctx;
    wh_buf_t **view; /* non-NULL: take a view instead of copying */
} wh__attempt_t;

/* A copy after WH_READ_HOLD_AFTER lost races holds its generation where the
 * backend can (a view pins for itself); one the pin policy refuses (the
 * area's pinner table is full) is an ordinary copy. */
static bool wh__attempt(wh_store_t *st, const wh__attempt_t *a, uint32_t lost, uint64_t gen,
                        uint32_t pos, wh_sample_meta_t *meta, wh_err_t *err) {
    if (a->view) return wh_store_view(st, gen, pos, a->view, meta, err);
    if (lost >= WH_READ_HOLD_AFTER && st->ops->read_held) {
        if (!wh_store_here(st, err)) return false;
        wh_err_t e = {0};
        if (st->ops->read_held(st, gen, pos, a->fn, a->ctx, meta, &e)) return true;
        if (e.code != WH_E_PINNED) {
            if (err) *err = e;
            return false;
        }
    }
    return wh_store_read(st, gen, pos, a->fn, a->ctx, meta, err);
}

static bool wh__policy(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                       const wh__attempt_t *a, wh_sample_meta_t *meta, wh_err_t *err);

bool wh_store_read_sample(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                          wh_dest_fn fn, void *ctx, wh_sample_meta_t *meta, wh_err_t *err) {
    wh__attempt_t a = {fn, ctx, NULL};
    return wh__policy(st, at, timeout_s, stop, &a, meta, err);
}

bool wh_store_view_sample(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                          wh_buf_t **out, wh_sample_meta_t *meta, wh_err_t *err) {
    wh__attempt_t a = {NULL, NULL, out};
    return wh__policy(st, at, timeout_s, stop, &a, meta, err);
}

/* Counts a read for the handle's heartbeat, and beats when it is due (a
 * lost beat only dims `status`). */
static void wh__count_read(wh_store_t *st, uint64_t gen) {
    wh_reader_beat_t *b = &st->beat;
    uint64_t now = wh_now_real_ns();
    if (!b->start_ns) b->start_ns = now;
    if (b->gen != gen) {
        b->gen = gen;
        b->gen_reads = 0;
    }
    b->reads++;
    b->gen_reads++;
    if (st->ops->beat && now - b->beat_ns >= (uint64_t)(st->ops->beat_every_s * 1e9)) {
        b->beat_ns = now;
        wh_err_t e = {0};
        st->ops->beat(st, b, &e);
    }
}

/* The read policy's exact mode (spec mode): at->spec_gen located again
 * (its need published first, so it is kept once made), waiting with the
 * policy's backoff up to timeout_s while it is not sealed; at->gen is then
 * its id. Through the ops, so this file and wh_spec.c call one way. */
static bool wh__relocate(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                         wh_err_t *err) {
    if (!st->cfg.spec || !st->ops->spec_need || !st->ops->spec_locate)
        return wh_err_set(err, WH_E_INVALID,
                          "store %s: a read of spec generation %llu needs a spec-mode store "
                          "(RUN_SEED)",
                          st->uri, (unsigned long long)at->spec_gen);
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)(timeout_s * 1e9);
    unsigned ms = WH_READ_BACKOFF_MIN_MS;
    for (;;) {
        uint64_t gen = 0;
        if (!st->ops->spec_need(st, at->spec_gen, err) ||
            !st->ops->spec_locate(st, at->spec_gen, &gen, err))
            return false;
        if (gen) {
            at->gen = gen;
            return true;
        }
        if ((stop && *stop) || wh_now_mono_ns() >= deadline)
            return wh_err_set(err, WH_E_TIMEOUT,
                              "spec generation %llu is not sealed after %gs: more generators, "
                              "or a higher REUSE, keep readers from waiting",
                              (unsigned long long)at->spec_gen, timeout_s);
        wh_sleep_ms(ms);
        ms = ms * 2 > WH_READ_BACKOFF_MAX_MS ? WH_READ_BACKOFF_MAX_MS : ms * 2;
    }
}

static bool wh__policy(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                       const wh__attempt_t *a, wh_sample_meta_t *meta, wh_err_t *err) {
    uint32_t cap = st->cfg.swap_cap;
    at->pad = false;
    at->gone = at->corrupt = 0;
    at->last_skip[0] = 0;
    if (!wh_store_pos_check(st, at->pos, err)) return false;
    if (at->exact) {
        if (!at->gen && !wh__relocate(st, at, timeout_s, stop, err)) return false;
    } else if (!at->gen && !wh_store_wait_gen(st, 0, timeout_s, stop, &at->gen, err)) {
        return false;
    }
    /* Ends: each lost race waits (up to timeout_s) for a generation other
     * than the lost one (after at most two immediate retries of a "not
     * sealed" below), so the loop goes on only while the store keeps
     * sealing new ones; a held copy cannot lose. */
    uint32_t lost = 0; /* in a row, for this position */
    for (;;) {
        wh_err_t e = {0};
        if (wh__attempt(st, a, lost, at->gen, at->pos, meta, &e)) {
            wh__count_read(st, at->gen);
            if (meta) st->last_params = meta->params_version;
            return true;
        }
        if (e.code == WH_E_GONE || e.code == WH_E_NOTFOUND || e.code == WH_E_NOSTORE ||
            e.code == WH_E_UNAVAIL) {
            at->gone++;
            lost++;
            if (at->exact) { /* the same spec generation, wherever it is made again */
                if (lost > WH_READ_EXACT_LOST)
                    return wh_err_set(err, WH_E_GONE,
                                      "position %u of spec generation %llu: lost %u races in "
                                      "a row (%s)",
                                      at->pos, (unsigned long long)at->spec_gen, lost, e.message);
                if (!wh__relocate(st, at, timeout_s, stop, err))
                    return wh_err_prefix(err, "position %u (%s)", at->pos, e.message);
                continue;
            }
            /* Not sealed where this handle looked: newer than its segment's
             * newest, as when the segment was made again and the handle has
             * yet to move. Its newest, even the asked one once it has moved,
             * is then what to read, not a wait for a generation other than
             * the asked one that may never come. */
            uint64_t other_than = e.code == WH_E_NOTFOUND && lost <= 2 ? 0 : at->gen;
            if (!wh_store_wait_gen(st, other_than, timeout_s, stop, &at->gen, err)) {
                if (err && err->code == WH_E_TIMEOUT)
                    wh_err_prefix(err, "position %u (%s)", at->pos, e.message);
                return false;
            }
            continue;
        }
        if (e.code == WH_E_CORRUPT && !at->strict && !at->exact) {
            memcpy(at->last_skip, e.message, sizeof at->last_skip);
            if (++at->corrupt >= cap) {
                if (err) *err = e;
                return wh_err_prefix(err, "every sample of generation %llu failed its check",
                                     (unsigned long long)at->gen);
            }
            at->pad = true;
            at->pos = (at->pos + 1) % cap;
            lost = 0;
            continue;
        }
        if (err) *err = e;
        return false;
    }
}

/* ---- parameters (docs/params.md): the calls over the backends ---- */

bool wh_store_params_set(wh_store_t *st, const char *doc, size_t len, uint64_t *version,
                         wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (len > WH_PARAMS_MAX)
        return wh_err_set(err, WH_E_TOOBIG,
                          "params document is %zu bytes, more than the %u bytes a store keeps", len,
                          WH_PARAMS_MAX);
    return st->ops->params_set(st, doc, len, version, err);
}

bool wh_store_params_get(wh_store_t *st, uint64_t *version, char **doc, size_t *len,
                         wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->params_get(st, version, doc, len, err);
}

bool wh_store_params_version(wh_store_t *st, uint64_t *version, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    return st->ops->params_version(st, version, err);
}

void wh_store_set_put_params(wh_store_t *st, uint64_t version) { st->put_params = version; }

uint64_t wh_store_last_params(const wh_store_t *st) { return st->last_params; }

void wh_store_set_min_params(wh_store_t *st, uint64_t v) {
    st->min_params = v;
    st->pv_gen = 0;
    st->pv_ok_gen = 0;
}

static bool wh__meta_only(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err) {
    WH_UNUSED(ctx);
    WH_UNUSED(meta);
    WH_UNUSED(dst);
    WH_UNUSED(err);
    return true; /* no destinations: nothing is copied */
}

bool wh_store_gen_params(wh_store_t *st, uint64_t gen, wh_gen_params_t *out, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (gen && gen == st->gp_gen) {
        *out = st->gp;
        return true;
    }
    memset(out, 0, sizeof *out);
    if (st->ops->gen_params) {
        if (!st->ops->gen_params(st, gen, out, err)) return false;
    } else {
        for (uint32_t pos = 0; pos < st->cfg.swap_cap; pos++) {
            wh_sample_meta_t meta;
            wh_err_t e = {0};
            if (!wh_store_read(st, gen, pos, wh__meta_only, NULL, &meta, &e)) {
                if (e.code != WH_E_CORRUPT && e.code != WH_E_SCHEMA) {
                    if (err) *err = e;
                    return false;
                }
                out->skipped++;
                continue;
            }
            wh_gen_params_add(out, meta.params_version);
        }
    }
    st->gp_gen = gen;
    st->gp = *out;
    return true;
}

/* wh_store_current's filter for a reader that asked for min_params: the
 * newest generation known to qualify (0: none yet). */
static bool wh__params_filter_gen(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    uint64_t g = *gen;
    if (!st->min_params || !g) return true;
    if (g != st->pv_gen) {
        wh_gen_params_t gp;
        wh_err_t e = {0};
        if (!wh_store_gen_params(st, g, &gp, &e)) {
            if (e.code != WH_E_GONE && e.code != WH_E_NOTFOUND) {
                if (err) *err = e;
                return false;
            }
            *gen = st->pv_ok_gen; /* reclaimed meanwhile: ask again next time */
            return true;
        }
        st->pv_gen = g;
        st->pv_gen_ok = gp.samples && gp.min >= st->min_params;
        if (st->pv_gen_ok && g > st->pv_ok_gen) st->pv_ok_gen = g;
    }
    *gen = st->pv_ok_gen;
    return true;
}

/* ---- the node-local tier's copy (wh_relay.c): source and target ---- */

bool wh_store_read_encoded(wh_store_t *st, uint64_t gen, uint32_t pos, wh_raw_fn fn, void *ctx,
                           wh_sample_meta_t *meta, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (!st->ops->read_encoded)
        return wh_store_lacks(st, WH_CAP_RELAY_SOURCE, "encoded reads (a relay's source)", err);
    if (!wh_store_pos_check(st, pos, err)) return false;
    return st->ops->read_encoded(st, gen, pos, fn, ctx, meta, err);
}

/* The mirror's three calls check alike. */
static bool wh__mirror_ok(wh_store_t *st, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (!(wh_store_caps(st) & WH_CAP_RELAY_TARGET))
        return wh_store_lacks(st, WH_CAP_RELAY_TARGET,
                              "mirrored generations (a relay's copy, LOCAL_CACHE)", err);
    return true;
}

bool wh_store_mirror_begin(wh_store_t *st, uint64_t gen, uint64_t budget, wh_err_t *err) {
    return wh__mirror_ok(st, err) && st->ops->mirror_begin(st, gen, budget, err);
}

bool wh_store_mirror_reserve(wh_store_t *st, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                             wh_err_t *err) {
    return wh__mirror_ok(st, err) && st->ops->mirror_reserve(st, gen, pos, size, dst, err);
}

bool wh_store_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err) {
    return wh__mirror_ok(st, err) && st->ops->mirror_commit(st, gen, pos, err);
}
