/* Embedded backend, spec mode (docs/reproducible.md): which spec
 * generation an area holds, the window readers' needs allow, claims under a
 * lease, failures, the seal of a complete spec generation, and the spec
 * put (with the put's reservations, wh_shm_put.c).
 *
 * Locks: the header's lock for opening, sealing and the window; an area's
 * lock for its claims and commits; the header's first where both are held.
 * Every spec field read from the segment is checked before it is used: a
 * damaged label, state or claim is an error or ignored, never trusted. */
#define _GNU_SOURCE
#include "wh_shm_int.h"

#include <limits.h>

/* The spec generation area i holds (+ 1), 0 when it holds none or a value
 * no area can hold (a damaged label). */
static uint64_t wh__label(const wh__slot_t *sl) {
    uint64_t l = __atomic_load_n(&sl->spec_label, __ATOMIC_ACQUIRE);
    return wh__ld(&sl->gen) && l != UINT64_MAX ? l : 0;
}
static bool wh__sealed(const wh__slot_t *sl) {
    return wh__label(sl) && __atomic_load_n(&sl->spec_state, __ATOMIC_ACQUIRE) == WH__SPEC_SEALED;
}
static bool wh__open(const wh__slot_t *sl) {
    return wh__label(sl) && __atomic_load_n(&sl->spec_state, __ATOMIC_ACQUIRE) == WH__SPEC_OPEN;
}

static bool wh__in_window(uint64_t spec_gen, uint64_t low) {
    return spec_gen >= low && spec_gen - low < WH_SPEC_AHEAD;
}

/* The lowest spec generation a live reader needs; with none, the floor the
 * last one left (a reader between epochs, or all gone). *pid: that reader
 * (0: none). Persists the answer as the floor. Header lock held. */
static uint64_t wh__need_min(wh__hdr_t *h, uint64_t *pid) {
    uint64_t low = UINT64_MAX;
    *pid = 0;
    for (int i = 0; i < WH__MAX_READERS; i++) {
        const wh__beat_t *e = &h->readers[i];
        uint64_t need = __atomic_load_n(&e->need, __ATOMIC_RELAXED);
        int64_t p = __atomic_load_n(&e->pid, __ATOMIC_RELAXED);
        if (!__atomic_load_n(&e->token, __ATOMIC_ACQUIRE) || !need || !wh__pid_alive(p)) continue;
        if (need - 1 < low) {
            low = need - 1;
            *pid = (uint64_t)p;
        }
    }
    if (low == UINT64_MAX) return wh__ld(&h->spec_floor);
    wh__st(&h->spec_floor, low);
    return low;
}

/* Area lock held: the area is reset and opened for spec generation
 * spec_gen under a new id, the commit point its gen store last; a kill
 * before that leaves an area with gen 0, which counts as free. */
static void wh__open_area(wh__shm_t *s, int slot, uint64_t spec_gen, uint64_t pv) {
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    wh__st(&sl->gen, 0); /* readers of what it held see GONE from here */
    __atomic_store_n(&sl->count, 0, __ATOMIC_RELEASE);
    wh__st(&sl->used, 0);
    __atomic_store_n(&sl->nholes, 0, __ATOMIC_RELEASE);
    memset(wh__index(s, slot), 0, (size_t)s->swap_cap * sizeof(wh__entry_t));
    memset(wh__claims(s, slot), 0, (size_t)s->swap_cap * sizeof(wh__claim_t));
    sl->spec_failed = 0;
    sl->spec_why[0] = 0;
    sl->spec_pv = pv;
    sl->spec_pv_len = 0;
    /* the params document of that version, while the side file still has it */
    char *doc = NULL;
    size_t len = 0;
    uint64_t v = 0;
    wh_err_t e = {0};
    if (wh_pfile_get(s->pfile, &v, &doc, &len, &e) && v == pv && len <= WH_PARAMS_MAX) {
        memcpy(wh__spec_params_copy(s, slot), doc, len);
        sl->spec_pv_len = (uint32_t)len;
    }
    free(doc);
    __atomic_store_n(&sl->spec_state, WH__SPEC_OPEN, __ATOMIC_RELEASE);
    wh__st(&sl->spec_label, spec_gen + 1);
    uint64_t id = wh__ld(&h->write_gen) + 1;
    wh__st(&h->write_gen, id);
    wh__st(&sl->gen, id); /* the commit point */
}

/* Header lock held: the area to open spec generation spec_gen in (one that
 * holds nothing the window keeps, no live writer and no live pin), locked;
 * -1 when every such area is pinned. */
static bool wh__take_area(wh__shm_t *s, uint64_t low, int *out, wh_err_t *err) {
    wh__hdr_t *h = s->hdr;
    int order[WH_SHM_AREAS], n = 0;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        const wh__slot_t *sl = &h->slots[i];
        uint64_t l = wh__label(sl);
        if (l && wh__sealed(sl) && wh__in_window(l - 1, low)) continue;
        if (wh__open(sl) && wh__in_window(l - 1, low)) continue;
        int k = n++; /* empty areas first, then the oldest generation */
        uint64_t g = wh__ld(&sl->gen);
        while (k > 0 && wh__ld(&h->slots[order[k - 1]].gen) > g) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    *out = -1;
    for (int k = 0; k < n; k++) {
        wh__slot_t *sl = &h->slots[order[k]];
        if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) return false;
        wh__shm_prune_writers(sl);
        wh__shm_prune_pins(sl);
        if (!sl->nwriters && !sl->npinners) {
            *out = order[k];
            return true;
        }
        wh__shm_unlock(&sl->lock);
    }
    return true;
}

/* Header lock held: seals area slot (holding gen) if every position is
 * committed and it is still open. */
static void wh__seal_locked(wh__shm_t *s, int slot, uint64_t gen, bool *sealed) {
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    *sealed = false;
    if (wh__ld(&sl->gen) != gen || !wh__open(sl) ||
        __atomic_load_n(&sl->count, __ATOMIC_ACQUIRE) < s->swap_cap)
        return;
    __atomic_store_n(&sl->spec_state, WH__SPEC_SEALED, __ATOMIC_RELEASE);
    if (wh__ld(&h->read_gen) < gen) wh__st(&h->read_gen, gen);
    __atomic_add_fetch(&h->seals, 1, __ATOMIC_RELAXED);
    uint32_t k = h->hist_next % WH__HIST;
    h->hist[k].generation = gen;
    h->hist[k].time_ns = wh_now_real_ns();
    h->hist[k].generated = __atomic_load_n(&h->generated, __ATOMIC_RELAXED);
    h->hist[k].discarded = __atomic_load_n(&h->discarded, __ATOMIC_RELAXED);
    h->hist[k].seal_ns = 0;
    __atomic_store_n(&h->hist_next, (k + 1) % WH__HIST, __ATOMIC_RELEASE);
    if (h->hist_n < WH__HIST) __atomic_store_n(&h->hist_n, h->hist_n + 1, __ATOMIC_RELEASE);
    *sealed = true;
}

static bool wh__spec_seal(wh__shm_t *s, int slot, uint64_t gen, bool *sealed, wh_err_t *err) {
    if (!wh__shm_lock(&s->hdr->lock, s->base.cfg.lease_s, err)) return false;
    wh__seal_locked(s, slot, gen, sealed);
    wh__shm_unlock(&s->hdr->lock);
    return true;
}

/* The open area (-1: none); one whose spec generation left the window is
 * abandoned (a reader resumed further back: it is not needed). Header lock
 * held. */
static int wh__open_area_of(wh__shm_t *s, uint64_t low, wh_err_t *err, bool *ok) {
    wh__hdr_t *h = s->hdr;
    *ok = true;
    int open = -1;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        wh__slot_t *sl = &h->slots[i];
        if (!wh__open(sl)) continue;
        bool sealed = false;
        wh__seal_locked(s, i, wh__ld(&sl->gen), &sealed); /* its last put died unsealed */
        if (sealed) continue;
        if (open < 0 && wh__in_window(wh__label(sl) - 1, low)) {
            open = i;
            continue;
        }
        if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) {
            *ok = false;
            return -1;
        }
        wh__st(&sl->gen, 0); /* abandoned: a later put of it is dropped as GONE */
        wh__shm_unlock(&sl->lock);
    }
    return open;
}

/* The failure of spec generation spec_gen (area slot), in the contract's
 * words. */
static bool wh__failed(const wh__slot_t *sl, wh_err_t *err) {
    char why[WH_ERR_LEN];
    wh__shm_hdr_text(why, sl->spec_why, sizeof why);
    return wh_err_set(err, WH_E_SPECFAIL, "%s", why);
}

static void wh__why(wh__shm_t *s, wh__slot_t *sl, uint64_t spec_gen, uint32_t pos,
                    uint32_t attempts, int32_t pid, const char *what) {
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    snprintf(sl->spec_why, sizeof sl->spec_why,
             "sample index %llu (generation %llu, position %u) failed %u attempts; last by pid "
             "%d on host %s%s",
             (unsigned long long)(spec_gen * s->swap_cap + pos), (unsigned long long)spec_gen, pos,
             attempts, (int)pid, host, what);
    __atomic_store_n(&sl->spec_failed, pos + 1, __ATOMIC_RELEASE);
}

/* Area lock held: the first position to claim (a dead or expired claim, or
 * one never claimed or given back), -1 when every one is held or put. A
 * position whose claimer is gone after its last attempt fails the area. */
static int wh__pick(wh__shm_t *s, wh__slot_t *sl, uint64_t spec_gen, double lease_s,
                    uint32_t max_attempts, bool *failed) {
    wh__claim_t *cl = wh__claims(s, (int)(sl - s->hdr->slots));
    const wh__entry_t *ix = wh__index(s, (int)(sl - s->hdr->slots));
    uint64_t now = wh_now_real_ns();
    *failed = false;
    for (uint32_t p = 0; p < s->swap_cap; p++) {
        wh__claim_t *c = &cl[p];
        if (ix[p].size || c->state == WH__CLAIM_DONE) continue; /* put */
        if (c->state == WH__CLAIM_HELD) {
            bool dead = !wh__pid_alive(c->pid);
            /* an expiry past the lease from now is damage: counted expired */
            bool expired = c->expiry_ns < now ||
                           c->expiry_ns - now > (uint64_t)(lease_s * 1e9) + 1000000000ull;
            if (!dead && !expired) continue;
            if (c->attempts >= max_attempts) {
                wh__why(s, sl, spec_gen, p, c->attempts, c->pid,
                        dead ? ", which died holding it" : ", whose claim expired");
                *failed = true;
                return -1;
            }
        } else if (c->attempts >= max_attempts) { /* given back after its last attempt */
            continue;
        }
        return (int)p;
    }
    return -1;
}

bool wh__shm_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                        wh_claim_status_t *status, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    if (!wh__shm_ready(s, NULL, 0, &e)) {
        /* BYTE_BUDGET auto, no segment yet: index 0's put creates it, sized
         * from that sample (gen 0: the put opens spec generation 0) */
        if (e.code != WH_E_NOSTORE || st->cfg.byte_budget || st->cfg.no_create) {
            if (err) *err = e;
            return false;
        }
        uint64_t pv = 0;
        if (!wh_pfile_version(s->pfile, &pv, NULL)) pv = 0;
        *out = (wh_claim_t){0, 0, 0, 0, pv, 1, s->token};
        *status = WH_CLAIM_OK;
        return true;
    }
    if (!wh__shm_intact(s, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh__shm_lock(&h->lock, st->cfg.lease_s, err)) return false;
    uint64_t pid = 0, low = wh__need_min(h, &pid);
    bool ok = true;
    int slot = wh__open_area_of(s, low, err, &ok);
    *status = WH_CLAIM_WAIT;
    if (ok && slot < 0) { /* open the lowest needed spec generation not stored */
        uint64_t next = low;
        for (bool again = true; again;) {
            again = false;
            for (int i = 0; i < WH_SHM_AREAS; i++)
                if (wh__sealed(&h->slots[i]) && wh__label(&h->slots[i]) - 1 == next) {
                    next++;
                    again = true;
                }
        }
        if (!wh__in_window(next, low)) {
            *status = WH_CLAIM_AHEAD;
        } else if ((ok = wh__take_area(s, low, &slot, err)) && slot >= 0) {
            uint64_t pv = 0;
            if (!wh_pfile_version(s->pfile, &pv, NULL)) pv = 0;
            wh__open_area(s, slot, next, pv);
            wh__shm_unlock(&h->slots[slot].lock);
        }
    }
    if (!ok || slot < 0) {
        wh__shm_unlock(&h->lock);
        return ok;
    }
    wh__slot_t *sl = &h->slots[slot];
    if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) {
        wh__shm_unlock(&h->lock);
        return false;
    }
    uint64_t spec_gen = wh__label(sl) - 1;
    bool failed = __atomic_load_n(&sl->spec_failed, __ATOMIC_ACQUIRE) != 0;
    int p = failed ? -1 : wh__pick(s, sl, spec_gen, lease_s, max_attempts, &failed);
    if (p >= 0) {
        wh__claim_t *c = &wh__claims(s, slot)[p];
        uint32_t attempt = c->attempts + 1;
        uint64_t token = s->token + 2 * ++s->puts;
        c->state = WH__CLAIM_HELD;
        c->token = token;
        c->pid = s->pid;
        c->expiry_ns = wh_now_real_ns() + (uint64_t)(lease_s * 1e9);
        __atomic_store_n(&c->attempts, attempt, __ATOMIC_RELEASE);
        *out = (wh_claim_t){spec_gen * s->swap_cap + (uint64_t)p,
                            spec_gen,
                            (uint32_t)p,
                            wh__ld(&sl->gen),
                            sl->spec_pv,
                            attempt,
                            token};
        *status = WH_CLAIM_OK;
    }
    if (failed) ok = wh__failed(sl, err);
    wh__shm_unlock(&sl->lock);
    wh__shm_unlock(&h->lock);
    return ok;
}

/* The area holding c's generation, locked, and c's claim entry; -1 (no
 * lock) when the generation is gone. */
static int wh__claim_area(wh__shm_t *s, const wh_claim_t *c, wh__claim_t **entry, wh_err_t *err,
                          bool *ok) {
    *ok = true;
    int slot = wh__shm_slot_of(s->hdr, c->gen);
    if (slot < 0 || c->pos >= s->swap_cap) return -1;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) {
        *ok = false;
        return -1;
    }
    if (wh__ld(&sl->gen) != c->gen || wh__label(sl) != c->spec_gen + 1) {
        wh__shm_unlock(&sl->lock);
        return -1;
    }
    *entry = &wh__claims(s, slot)[c->pos];
    return slot;
}

bool wh__shm_spec_renew(wh_store_t *st, const wh_claim_t *c, double lease_s, bool *mine,
                        wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    *mine = false;
    if (!wh__shm_ready(s, NULL, 0, err) || !wh__shm_intact(s, err)) return false;
    wh__claim_t *e;
    bool ok;
    int slot = wh__claim_area(s, c, &e, err, &ok);
    if (slot < 0) return ok;
    if (e->token == c->token && e->state == WH__CLAIM_HELD && !wh__index(s, slot)[c->pos].size) {
        e->expiry_ns = wh_now_real_ns() + (uint64_t)(lease_s * 1e9);
        *mine = true;
    }
    wh__shm_unlock(&s->hdr->slots[slot].lock);
    return true;
}

bool wh__shm_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts, const char *why,
                       bool *failed, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    *failed = false;
    if (!wh__shm_ready(s, NULL, 0, err) || !wh__shm_intact(s, err)) return false;
    wh__claim_t *e;
    bool ok;
    int slot = wh__claim_area(s, c, &e, err, &ok);
    if (slot < 0) return ok;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (e->token == c->token && e->state == WH__CLAIM_HELD) {
        if (e->attempts >= max_attempts && !sl->spec_failed) {
            char what[WH_ERR_LEN];
            snprintf(what, sizeof what, ": %s", why);
            wh__why(s, sl, c->spec_gen, c->pos, e->attempts, s->pid, what);
            *failed = true;
        }
        e->state = WH__CLAIM_FREE; /* given back: the next claim tries it again */
    }
    wh__shm_unlock(&sl->lock);
    return true;
}

bool wh__shm_spec_locate(wh_store_t *st, uint64_t spec_gen, uint64_t *gen, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    *gen = 0;
    if (!wh__shm_ready(s, NULL, 0, &e)) { /* no store yet: nothing sealed yet */
        if (e.code == WH_E_NOSTORE) return true;
        if (err) *err = e;
        return false;
    }
    if (!wh__shm_intact(s, err)) return false;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        wh__slot_t *sl = &s->hdr->slots[i];
        if (wh__label(sl) != spec_gen + 1) continue;
        if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
        bool ok = true;
        if (wh__label(sl) == spec_gen + 1) {
            if (wh__sealed(sl))
                *gen = wh__ld(&sl->gen);
            else if (__atomic_load_n(&sl->spec_failed, __ATOMIC_ACQUIRE))
                ok = wh__failed(sl, err);
        }
        wh__shm_unlock(&sl->lock);
        if (!ok || *gen) return ok;
    }
    return true;
}

bool wh__shm_spec_need(wh_store_t *st, uint64_t spec_gen, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    if (!wh__shm_ready(s, NULL, 0, &e)) { /* said again once the store exists */
        if (e.code == WH_E_NOSTORE) return true;
        if (err) *err = e;
        return false;
    }
    wh_reader_beat_t *b = &st->beat;
    b->need = spec_gen + 1;
    b->beat_ns = wh_now_real_ns();
    if (!b->start_ns) b->start_ns = b->beat_ns;
    return wh__shm_beat(st, b, err);
}

bool wh__shm_spec_params(wh_store_t *st, const wh_claim_t *c, char **doc, size_t *len,
                         wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    if (!wh__shm_ready(s, NULL, 0, &e)) {
        if (e.code != WH_E_NOSTORE) {
            if (err) *err = e;
            return false;
        }
        /* the store's first claim: the side file's document, of that version */
        uint64_t v = 0;
        if (!wh_pfile_get(s->pfile, &v, doc, len, err)) return false;
        if (v == c->params_version) return true;
        free(*doc);
        *doc = NULL;
        return wh_err_set(err, WH_E_GONE, "params version %llu was replaced by %llu",
                          (unsigned long long)c->params_version, (unsigned long long)v);
    }
    if (!wh__shm_intact(s, err)) return false;
    wh__claim_t *entry;
    bool ok;
    int slot = wh__claim_area(s, c, &entry, err, &ok);
    if (slot < 0)
        return ok && wh_err_set(err, WH_E_GONE, "generation %llu was reclaimed",
                                (unsigned long long)c->gen);
    wh__slot_t *sl = &s->hdr->slots[slot];
    uint32_t n = sl->spec_pv_len;
    if (!c->params_version) { /* never set: the empty document */
        n = 0;
    } else if (n > WH_PARAMS_MAX || !n) {
        wh__shm_unlock(&sl->lock);
        return wh_err_set(err, WH_E_CORRUPT,
                          "shm store '%s': the params document of version %llu is not kept for "
                          "spec generation %llu",
                          s->name, (unsigned long long)c->params_version,
                          (unsigned long long)c->spec_gen);
    }
    *doc = malloc(n ? n + 1 : 3);
    if (*doc) {
        if (n)
            memcpy(*doc, wh__spec_params_copy(s, slot), n);
        else
            memcpy(*doc, "{}", 2);
        *len = n ? n : 2;
        (*doc)[*len] = 0;
    }
    wh__shm_unlock(&sl->lock);
    if (!*doc) return wh_err_set(err, WH_E_SYS, "out of memory");
    return wh__shm_intact(s, err);
}

bool wh__shm_spec_status(wh_store_t *st, wh_spec_status_t *o, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    if (!wh__shm_ready(s, NULL, 0, &e)) {
        if (e.code == WH_E_NOSTORE) return true;
        if (err) *err = e;
        return false;
    }
    wh__hdr_t *h = s->hdr;
    if (!h->spec) return true;
    o->spec = true;
    o->run_seed = h->run_seed;
    o->duplicates = __atomic_load_n(&h->spec_dups, __ATOMIC_RELAXED);
    o->nondeterministic = __atomic_load_n(&h->spec_nondet, __ATOMIC_RELAXED);
    /* never blocks for long, as status: unlocked figures when stuck */
    bool locked = wh__shm_lock(&h->lock, 0.2, NULL);
    uint64_t pid = 0;
    o->floor = locked ? wh__need_min(h, &pid) : wh__ld(&h->spec_floor);
    o->reader = pid != 0;
    o->slowest = o->floor;
    o->slowest_pid = pid;
    uint64_t now = wh_now_real_ns();
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        wh__slot_t *sl = &h->slots[i];
        uint64_t l = wh__label(sl);
        if (!l) continue;
        if (wh__sealed(sl) && (!o->any_sealed || l - 1 > o->last_sealed)) {
            o->any_sealed = true;
            o->last_sealed = l - 1;
        }
        if (__atomic_load_n(&sl->spec_failed, __ATOMIC_ACQUIRE) && !o->failed) {
            o->failed = true;
            wh__shm_hdr_text(o->failure, sl->spec_why, sizeof o->failure);
        }
        if (!wh__open(sl)) continue;
        o->open = true;
        o->open_gen = l - 1;
        o->open_fill = __atomic_load_n(&sl->count, __ATOMIC_ACQUIRE);
        if (o->open_fill > s->swap_cap) o->open_fill = s->swap_cap;
        const wh__claim_t *cl = wh__claims(s, i);
        const wh__entry_t *ix = wh__index(s, i);
        char host[64] = "";
        gethostname(host, sizeof host - 1);
        for (uint32_t p = 0; p < s->swap_cap && o->nclaims < WH_SPEC_CLAIMS_SHOWN; p++) {
            if (cl[p].state != WH__CLAIM_HELD || ix[p].size) continue;
            uint64_t since = cl[p].expiry_ns > now ? 0 : now - cl[p].expiry_ns;
            int k = o->nclaims++;
            o->claims[k].index = (l - 1) * s->swap_cap + p;
            o->claims[k].pid = cl[p].pid > 0 ? (uint64_t)cl[p].pid : 0;
            snprintf(o->claims[k].host, sizeof o->claims[k].host, "%s", host);
            /* the age since its last renewal is what the lease counts */
            o->claims[k].age_s = since ? (double)since / 1e9 : 0.0;
            o->claims[k].attempt = cl[p].attempts;
        }
    }
    if (locked) wh__shm_unlock(&h->lock);
    return true;
}

/* A manager's seal on a spec store: the open generation once complete
 * (its last put seals it itself; this covers a put that died between). */
bool wh__shm_spec_seal_full(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    *sealed = false;
    if (!wh__shm_lock(&h->lock, st->cfg.lease_s, err)) return false;
    for (int i = 0; i < WH_SHM_AREAS && !*sealed; i++) {
        uint64_t g = wh__ld(&h->slots[i].gen);
        if (wh__open(&h->slots[i])) wh__seal_locked(s, i, g, sealed);
        if (*sealed) {
            info->generation = g;
            info->generated = __atomic_load_n(&h->generated, __ATOMIC_RELAXED);
            info->discarded = __atomic_load_n(&h->discarded, __ATOMIC_RELAXED);
        }
    }
    wh__shm_unlock(&h->lock);
    return true;
}

/* The generation a put of c goes to: c->gen, or for the store's first
 * claim (gen 0, made before the store existed) the open generation of
 * spec generation 0, opened here if none is open yet. 0: another spec
 * generation is open already (the put is dropped as GONE). */
static bool wh__spec_open_for(wh__shm_t *s, const wh_claim_t *c, uint64_t *gen, wh_err_t *err) {
    wh__hdr_t *h = s->hdr;
    *gen = c->gen;
    if (c->gen) return true;
    if (!wh__shm_lock(&h->lock, s->base.cfg.lease_s, err)) return false;
    uint64_t pid = 0, low = wh__need_min(h, &pid);
    bool ok = true;
    int slot = wh__open_area_of(s, low, err, &ok);
    if (ok && slot < 0 && wh__in_window(c->spec_gen, low) &&
        (ok = wh__take_area(s, low, &slot, err)) && slot >= 0) {
        wh__open_area(s, slot, c->spec_gen, c->params_version);
        wh__shm_unlock(&h->slots[slot].lock);
    }
    if (ok && slot >= 0 && wh__label(&h->slots[slot]) == c->spec_gen + 1)
        *gen = wh__ld(&h->slots[slot].gen);
    wh__shm_unlock(&h->lock);
    return ok;
}

/* ---- spec mode: a sample at its position (docs/reproducible.md) ---- */

/* SAME or DIFFERENT: sample meta (just encoded, checksums set) against the
 * one committed at (gen, pos) of area slot. Area lock held. */
static wh_spec_put_t wh__dup(const wh__shm_t *s, int slot, uint64_t gen, uint32_t pos,
                             const wh_sample_meta_t *meta) {
    wh__entry_t e = wh__index(s, slot)[pos];
    wh_sample_meta_t won;
    if (e.off > s->slot_bytes || e.size > s->slot_bytes - e.off ||
        !wh_sample_decode_meta(wh__data(s, slot) + e.off, e.size, &s->base.cfg.schema, gen, pos,
                               &won, NULL) ||
        won.nfields != meta->nfields)
        return WH_SPEC_PUT_DIFFERENT;
    for (int i = 0; i < meta->nfields; i++)
        if (!wh_field_meta_same(&won.f[i], &meta->f[i]) || won.f[i].checksum != meta->f[i].checksum)
            return WH_SPEC_PUT_DIFFERENT;
    return WH_SPEC_PUT_SAME;
}

static void wh__count_dup(wh__hdr_t *h, wh_spec_put_t st) {
    __atomic_fetch_add(&h->spec_dups, 1, __ATOMIC_RELAXED);
    if (st == WH_SPEC_PUT_DIFFERENT) __atomic_fetch_add(&h->spec_nondet, 1, __ATOMIC_RELAXED);
}

/* The area of spec generation c->spec_gen held as gen, locked and checked
 * (-1, unlocked: gone, or abandoned). */
static int wh__spec_area(wh__shm_t *s, const wh_claim_t *c, uint64_t gen, wh_err_t *err, bool *ok) {
    *ok = true;
    int slot = wh__shm_slot_of(s->hdr, gen);
    if (slot < 0) return -1;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) {
        *ok = false;
        return -1;
    }
    if (!wh__shm_slot_sane(s, sl, slot, err)) {
        wh__shm_unlock(&sl->lock);
        *ok = false;
        return -1;
    }
    if (wh__ld(&sl->gen) != gen ||
        __atomic_load_n(&sl->spec_label, __ATOMIC_ACQUIRE) != c->spec_gen + 1) {
        wh__shm_unlock(&sl->lock);
        return -1;
    }
    return slot;
}

/* Already committed before any bytes are reserved (area lock held on
 * entry, released here): encoded aside only to compare its checksums with
 * the winner's. */
static bool wh__spec_put_late(wh__shm_t *s, int slot, uint64_t gen, uint32_t pos,
                              const wh_array_t *arr, wh_sample_meta_t *meta, wh_spec_put_t *status,
                              wh_err_t *err) {
    wh__slot_t *sl = &s->hdr->slots[slot];
    wh__shm_unlock(&sl->lock);
    void *tmp = malloc(meta->total_size ? meta->total_size : 1);
    if (!tmp) return wh_err_set(err, WH_E_SYS, "out of memory");
    bool ok = wh_sample_encode(tmp, meta->total_size, &s->base.cfg.schema, arr, meta, false, err);
    free(tmp);
    if (!ok || !wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) return false;
    *status = wh__ld(&sl->gen) == gen ? wh__dup(s, slot, gen, pos, meta) : WH_SPEC_PUT_GONE;
    wh__shm_unlock(&sl->lock);
    if (*status != WH_SPEC_PUT_GONE) wh__count_dup(s->hdr, *status);
    return true;
}

bool wh__shm_spec_put(wh_store_t *st, const wh_claim_t *c, const wh_array_t *arr, int n,
                      wh_spec_put_t *status, bool *sealed, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_sample_meta_t meta;
    *status = WH_SPEC_PUT_GONE;
    if (!wh__shm_ready(s, arr, n, err)) return false; /* a store's first put creates it */
    if (!wh_sample_plan(&st->cfg.schema, arr, n, &meta, err) || !wh__shm_intact(s, err))
        return false;
    meta.params_version = c->params_version;
    uint64_t size = meta.total_size, gen = 0, off = 0;
    if (size > s->slot_bytes)
        return wh_err_set(err, WH_E_TOOBIG,
                          "sample index %llu of %llu bytes does not fit a generation's "
                          "BYTE_BUDGET of %llu bytes; raise BYTE_BUDGET to at least SWAP_CAP x "
                          "sample size (%llu) after `wirehead-torch clean`",
                          (unsigned long long)c->index, (unsigned long long)size,
                          (unsigned long long)s->slot_bytes,
                          (unsigned long long)size * s->swap_cap);
    if (!wh__spec_open_for(s, c, &gen, err)) return false;
    if (!gen) return true; /* another spec generation is open: this one is not needed now */
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)(st->cfg.lease_s * 1e9);
    int slot, wi;
    for (;;) {
        bool ok;
        slot = wh__spec_area(s, c, gen, err, &ok);
        if (slot < 0) return ok; /* GONE */
        wh__slot_t *sl = &s->hdr->slots[slot];
        if (wh__index(s, slot)[c->pos].size)
            return wh__spec_put_late(s, slot, gen, c->pos, arr, &meta, status, err);
        wi = wh__shm_take_writer(sl, s->pid);
        bool fits = false;
        if (wi >= 0) {
            sl->writers[wi].token = s->token + 2 * ++s->puts;
            fits = wh__shm_reserve(sl, s->slot_bytes, size, &off);
            if (!fits) {
                wh__shm_prune_writers(sl);
                fits = wh__shm_reserve(sl, s->slot_bytes, size, &off);
            }
            if (fits) {
                sl->writers[wi].off = off;
                sl->writers[wi].size = size;
                wh__shm_unlock(&sl->lock);
                break;
            }
            sl->writers[wi].pid = 0;
            sl->nwriters--;
        }
        uint32_t busy = sl->nwriters, count = sl->count;
        wh__shm_unlock(&sl->lock);
        if (busy == 0 || wh_now_mono_ns() >= deadline)
            return wh_err_set(err, WH_E_TOOBIG,
                              "spec generation %llu filled its BYTE_BUDGET of %llu bytes with "
                              "only %u of SWAP_CAP=%u samples; raise BYTE_BUDGET to at least "
                              "SWAP_CAP x sample size (%llu bytes) after `wirehead-torch clean`",
                              (unsigned long long)c->spec_gen, (unsigned long long)s->slot_bytes,
                              count, s->swap_cap, (unsigned long long)size * s->swap_cap);
        wh_sleep_ms(1); /* in-flight puts end, or give their bytes back */
    }
    wh__slot_t *sl = &s->hdr->slots[slot];
    char *dst = wh__data(s, slot) + off;
    bool ok = wh_sample_encode(dst, size, &st->cfg.schema, arr, &meta, true, err);
    if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
    uint64_t token = s->token + 2 * s->puts;
    bool mine = sl->writers[wi].pid == s->pid && sl->writers[wi].token == token;
    bool here = wh__ld(&sl->gen) == gen &&
                __atomic_load_n(&sl->spec_label, __ATOMIC_ACQUIRE) == c->spec_gen + 1;
    wh__entry_t *e = &wh__index(s, slot)[c->pos];
    bool commit = mine && ok && here && !e->size && sl->count < s->swap_cap;
    if (ok && mine && here && e->size) {
        *status = wh__dup(s, slot, gen, c->pos, &meta);
        wh__count_dup(s->hdr, *status);
    }
    if (mine) wh__shm_end_writer(sl, wi, commit);
    if (commit) {
        wh_sample_set_place(dst, &meta, gen, c->pos); /* before the commit point */
        e->off = off;
        __atomic_store_n(&e->size, size, __ATOMIC_RELEASE);
        __atomic_store_n(&wh__claims(s, slot)[c->pos].state, WH__CLAIM_DONE, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->count, sl->count + 1, __ATOMIC_RELEASE); /* commit point */
        __atomic_fetch_add(&s->hdr->generated, 1, __ATOMIC_RELAXED);
        wh__put_seen(s->hdr);
        *status = WH_SPEC_PUT_ACCEPTED;
    }
    uint32_t count = sl->count;
    wh__shm_unlock(&sl->lock);
    if (!ok) return false;
    if (commit && count >= s->swap_cap) return wh__spec_seal(s, slot, gen, sealed, err);
    return true;
}
