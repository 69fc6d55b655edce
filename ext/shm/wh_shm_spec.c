/* Embedded backend, spec mode (docs/reproducible.md): which spec
 * generation an area holds, the window readers' needs allow, claims under a
 * lease, failures, and the seal of a complete spec generation. The spec put
 * itself is in wh_shm_put.c, beside the put whose reservations it shares.
 *
 * Locks: the header's lock for opening, sealing and the window; an area's
 * lock for its claims and commits; the header's first where both are held.
 * A holder killed between two stores leaves its locks to the next taker,
 * so every store below leaves a state the next claimer can use or repair
 * (wh_fault_spec_step numbers them; tests kill at each in turn).
 * Every spec field read from the segment is checked before it is used: a
 * damaged label, state, claim or params copy is an error or ignored, never
 * trusted. */
#define _GNU_SOURCE
#include "wh_shm_int.h"

#include <limits.h>
#include <xxhash.h>

/* CLAIM_LEASE's bound (config.py): a claim's recorded lease never counts
 * for more, so a forged one cannot hold an index for longer */
#define WH__CLAIM_LEASE_MAX_MS 1000000000u
/* an area lock another holds this long while the header's is held: that
 * area is passed over (its holder is stopped), not waited for */
#define WH__AREA_TRY_S 0.05

/* The check word of label on an area holding gen (never 0). */
static uint64_t wh__check(uint64_t gen, uint64_t label) {
    uint64_t v[2] = {gen, label};
    return XXH3_64bits_withSeed(v, sizeof v, WH__SHM_MAGIC) | 1;
}

/* The highest spec generation whose indices (and its window's) fit 64 bits. */
static uint64_t wh__spec_max(const wh__shm_t *s) {
    return (UINT64_MAX - (s->swap_cap - 1)) / s->swap_cap - WH_SPEC_AHEAD;
}

/* The spec generation area sl holds, + 1; 0 when it holds none, or a label
 * that fails its check word (damage: then the area holds nothing the
 * window keeps) or is past wh__spec_max. */
static uint64_t wh__label(const wh__shm_t *s, const wh__slot_t *sl) {
    uint64_t g = wh__ld(&sl->gen);
    uint64_t l = __atomic_load_n(&sl->spec_label, __ATOMIC_ACQUIRE);
    uint64_t c = __atomic_load_n(&sl->spec_check, __ATOMIC_ACQUIRE);
    if (!g || !l || l - 1 > wh__spec_max(s) || c != wh__check(g, l)) return 0;
    return l;
}
static bool wh__sealed(const wh__shm_t *s, const wh__slot_t *sl) {
    return wh__label(s, sl) &&
           __atomic_load_n(&sl->spec_state, __ATOMIC_ACQUIRE) == WH__SPEC_SEALED;
}
static bool wh__open(const wh__shm_t *s, const wh__slot_t *sl) {
    return wh__label(s, sl) && __atomic_load_n(&sl->spec_state, __ATOMIC_ACQUIRE) == WH__SPEC_OPEN;
}

bool wh__shm_spec_holds(const wh__shm_t *s, const wh__slot_t *sl, uint64_t gen,
                        const wh_claim_t *c) {
    return wh__ld(&sl->gen) == gen && wh__label(s, sl) == c->spec_gen + 1 &&
           __atomic_load_n(&sl->spec_pv, __ATOMIC_RELAXED) == c->params_version;
}

static bool wh__in_window(uint64_t spec_gen, uint64_t low) {
    return spec_gen >= low && spec_gen - low < WH_SPEC_AHEAD;
}

/* The lowest spec generation a live reader needs; with none, the floor the
 * last one left (a reader between epochs, or all gone). *pid: that reader
 * (0: none). Persists the answer as the floor. A need or floor past
 * wh__spec_max (damage) counts as none. Header lock held. */
static uint64_t wh__need_min(const wh__shm_t *s, uint64_t *pid) {
    wh__hdr_t *h = s->hdr;
    uint64_t low = UINT64_MAX;
    *pid = 0;
    for (int i = 0; i < WH__MAX_READERS; i++) {
        const wh__beat_t *e = &h->readers[i];
        uint64_t need = __atomic_load_n(&e->need, __ATOMIC_RELAXED);
        int64_t p = __atomic_load_n(&e->pid, __ATOMIC_RELAXED);
        if (!__atomic_load_n(&e->token, __ATOMIC_ACQUIRE) || !need || need - 1 > wh__spec_max(s) ||
            !wh__pid_alive(p))
            continue;
        if (need - 1 < low) {
            low = need - 1;
            *pid = (uint64_t)p;
        }
    }
    if (low == UINT64_MAX) {
        uint64_t floor = wh__ld(&h->spec_floor);
        return floor <= wh__spec_max(s) ? floor : 0;
    }
    wh__st(&h->spec_floor, low);
    return low;
}

/* The claim's lease as recorded (bounded), in ns. */
static uint64_t wh__lease_ns(const wh__claim_t *c) {
    uint32_t ms = c->lease_ms < WH__CLAIM_LEASE_MAX_MS ? c->lease_ms : WH__CLAIM_LEASE_MAX_MS;
    return (uint64_t)ms * 1000000ull;
}

/* Expired, or an expiry further out than its lease allows (damage). */
static bool wh__expired(const wh__claim_t *c, uint64_t now) {
    return c->expiry_ns < now || c->expiry_ns - now > wh__lease_ns(c) + 1000000000ull;
}

static uint32_t wh__lease_ms(double lease_s) {
    double ms = lease_s * 1e3 + 0.999;
    return ms >= WH__CLAIM_LEASE_MAX_MS ? WH__CLAIM_LEASE_MAX_MS : (uint32_t)ms;
}

/* Both locks held: area slot is reset and opened for spec generation
 * spec_gen under a new id, with the params document doc (len bytes) of
 * version pv; the commit point is its gen store, last. A kill before that
 * leaves an area with gen 0, which counts as free. */
static void wh__open_area(wh__shm_t *s, int slot, uint64_t spec_gen, uint64_t pv, const char *doc,
                          size_t len) {
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    int step = 0;
    wh__st(&sl->gen, 0); /* readers of what it held see GONE from here */
    wh_fault_spec_step("open", ++step);
    __atomic_store_n(&sl->count, 0, __ATOMIC_RELEASE);
    wh_fault_spec_step("open", ++step);
    wh__st(&sl->used, 0);
    wh_fault_spec_step("open", ++step);
    __atomic_store_n(&sl->nholes, 0, __ATOMIC_RELEASE);
    wh_fault_spec_step("open", ++step);
    memset(wh__index(s, slot), 0, (size_t)s->swap_cap * sizeof(wh__entry_t));
    wh_fault_spec_step("open", ++step);
    memset(wh__claims(s, slot), 0, (size_t)s->swap_cap * sizeof(wh__claim_t));
    wh_fault_spec_step("open", ++step);
    sl->spec_failed = 0;
    sl->spec_why[0] = 0;
    sl->spec_pv = pv;
    wh_fault_spec_step("open", ++step);
    memcpy(wh__spec_params_copy(s, slot), doc, len);
    sl->spec_pv_len = (uint32_t)len;
    sl->spec_pv_sum = XXH3_64bits_withSeed(doc, len, pv);
    wh_fault_spec_step("open", ++step);
    __atomic_store_n(&sl->spec_state, WH__SPEC_OPEN, __ATOMIC_RELEASE);
    wh__st(&sl->spec_label, spec_gen + 1);
    wh_fault_spec_step("open", ++step);
    uint64_t id = wh__ld(&h->write_gen) + 1;
    wh__st(&sl->spec_check, wh__check(id, spec_gen + 1));
    wh_fault_spec_step("open", ++step);
    wh__st(&h->write_gen, id);
    wh_fault_spec_step("open", ++step);
    wh__st(&sl->gen, id); /* the commit point */
    wh_fault_spec_step("open", ++step);
}

/* Header lock held: the area to open a spec generation in (one that holds
 * nothing the window keeps, no live writer and no live pin), locked; -1
 * when every such area is pinned, written to or its lock is stuck. */
static void wh__take_area(wh__shm_t *s, uint64_t low, int *out) {
    wh__hdr_t *h = s->hdr;
    int order[WH_SHM_AREAS], n = 0;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        const wh__slot_t *sl = &h->slots[i];
        uint64_t l = wh__label(s, sl);
        if (l && (wh__sealed(s, sl) || wh__open(s, sl)) && wh__in_window(l - 1, low)) continue;
        int k = n++; /* empty areas first, then the oldest generation */
        uint64_t g = wh__ld(&sl->gen);
        while (k > 0 && wh__ld(&h->slots[order[k - 1]].gen) > g) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    double try_s = s->base.cfg.lease_s < WH__AREA_TRY_S ? s->base.cfg.lease_s : WH__AREA_TRY_S;
    *out = -1;
    for (int k = 0; k < n; k++) {
        wh__slot_t *sl = &h->slots[order[k]];
        if (!wh__shm_lock(&sl->lock, try_s, NULL)) continue;
        wh__shm_prune_writers(sl);
        wh__shm_prune_pins(sl);
        if (!sl->nwriters && !sl->npinners) {
            *out = order[k];
            return;
        }
        wh__shm_unlock(&sl->lock);
    }
}

/* Area lock held: counts the positions committed (an index entry with
 * bytes) and keeps that count (a put killed between its commit and its
 * count left it short). True when every position is. */
static bool wh__complete(wh__shm_t *s, int slot) {
    wh__slot_t *sl = &s->hdr->slots[slot];
    const wh__entry_t *ix = wh__index(s, slot);
    uint32_t n = 0;
    for (uint32_t p = 0; p < s->swap_cap; p++)
        n += __atomic_load_n(&ix[p].size, __ATOMIC_ACQUIRE) != 0;
    if (__atomic_load_n(&sl->count, __ATOMIC_RELAXED) != n)
        __atomic_store_n(&sl->count, n, __ATOMIC_RELEASE);
    return n == s->swap_cap;
}

/* Both locks held: seals area slot if it still holds gen, is open and
 * every position is committed. The state store is the commit point; the
 * read path's bound (read_gen) moves first, as nothing moves it after. */
static void wh__seal_held(wh__shm_t *s, int slot, uint64_t gen, bool *sealed) {
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    int step = 0;
    *sealed = false;
    if (wh__ld(&sl->gen) != gen || !wh__open(s, sl) || !wh__complete(s, slot)) return;
    if (wh__ld(&h->read_gen) < gen) wh__st(&h->read_gen, gen);
    wh_fault_spec_step("seal", ++step);
    __atomic_store_n(&sl->spec_state, WH__SPEC_SEALED, __ATOMIC_RELEASE);
    wh_fault_spec_step("seal", ++step);
    __atomic_add_fetch(&h->seals, 1, __ATOMIC_RELAXED);
    wh_fault_spec_step("seal", ++step);
    uint32_t k = h->hist_next % WH__HIST;
    h->hist[k].generation = gen;
    h->hist[k].time_ns = wh_now_real_ns();
    h->hist[k].generated = __atomic_load_n(&h->generated, __ATOMIC_RELAXED);
    h->hist[k].discarded = __atomic_load_n(&h->discarded, __ATOMIC_RELAXED);
    h->hist[k].seal_ns = 0;
    wh_fault_spec_step("seal", ++step);
    __atomic_store_n(&h->hist_next, (k + 1) % WH__HIST, __ATOMIC_RELEASE);
    if (h->hist_n < WH__HIST) __atomic_store_n(&h->hist_n, h->hist_n + 1, __ATOMIC_RELEASE);
    wh_fault_spec_step("seal", ++step);
    *sealed = true;
}

/* Header lock held: wh__seal_held under the area's lock. */
static bool wh__seal_locked(wh__shm_t *s, int slot, uint64_t gen, bool *sealed, wh_err_t *err) {
    wh__slot_t *sl = &s->hdr->slots[slot];
    *sealed = false;
    if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) return false;
    wh__seal_held(s, slot, gen, sealed);
    wh__shm_unlock(&sl->lock);
    return true;
}

bool wh__shm_spec_seal(wh__shm_t *s, int slot, uint64_t gen, bool *sealed, wh_err_t *err) {
    if (!wh__shm_lock(&s->hdr->lock, s->base.cfg.lease_s, err)) return false;
    bool ok = wh__seal_locked(s, slot, gen, sealed, err);
    wh__shm_unlock(&s->hdr->lock);
    return ok;
}

/* Header lock held: *out the open area (-1: none). An open area whose
 * count says complete is sealed first (its last put died before sealing);
 * one whose spec generation left the window is abandoned (a reader resumed
 * further back: it is not needed), as is any open area past the first. */
static bool wh__open_area_of(wh__shm_t *s, uint64_t low, int *out, wh_err_t *err) {
    wh__hdr_t *h = s->hdr;
    *out = -1;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        wh__slot_t *sl = &h->slots[i];
        if (!wh__open(s, sl)) continue;
        uint64_t g = wh__ld(&sl->gen);
        bool sealed = false;
        if (__atomic_load_n(&sl->count, __ATOMIC_ACQUIRE) >= s->swap_cap &&
            !wh__seal_locked(s, i, g, &sealed, err))
            return false;
        if (sealed) continue;
        if (*out < 0 && wh__in_window(wh__label(s, sl) - 1, low)) {
            *out = i;
            continue;
        }
        if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) return false;
        if (wh__ld(&sl->gen) == g) wh__st(&sl->gen, 0); /* a later put of it is dropped as GONE */
        wh_fault_spec_step("abandon", 1);
        wh__shm_unlock(&sl->lock);
    }
    return true;
}

/* Header lock held, no area open: opens the lowest spec generation of the
 * window that is not sealed in an area, in *slot (-1 and *status AHEAD when
 * the window is full, WAIT when no area is free). */
static bool wh__open_next(wh__shm_t *s, uint64_t low, wh_claim_status_t *status, int *slot,
                          wh_err_t *err) {
    wh__hdr_t *h = s->hdr;
    uint64_t next = low;
    *slot = -1;
    for (bool again = true; again;) {
        again = false;
        for (int i = 0; i < WH_SHM_AREAS; i++)
            if (wh__sealed(s, &h->slots[i]) && wh__label(s, &h->slots[i]) - 1 == next) {
                next++;
                again = true;
            }
    }
    if (!wh__in_window(next, low)) {
        *status = WH_CLAIM_AHEAD;
        return true;
    }
    *status = WH_CLAIM_WAIT;
    /* the version in force now and its document, read together: a set
     * between two reads would record a version without its document */
    uint64_t pv = 0;
    char *doc = NULL;
    size_t len = 0;
    if (!wh_pfile_get(s->pfile, &pv, &doc, &len, err))
        return wh_err_prefix(err, "open spec generation %llu", (unsigned long long)next);
    if (len > WH_PARAMS_MAX) {
        free(doc);
        return wh_err_set(err, WH_E_CORRUPT, "params version %llu: %zu bytes, at most %u",
                          (unsigned long long)pv, len, WH_PARAMS_MAX);
    }
    wh__take_area(s, low, slot);
    if (*slot >= 0) {
        wh__open_area(s, *slot, next, pv, doc, len);
        wh__shm_unlock(&h->slots[*slot].lock);
    }
    free(doc);
    return true;
}

/* The failure of index (spec_gen, pos), in the contract's words. */
static void wh__why(const wh__shm_t *s, char *out, size_t cap, uint64_t spec_gen, uint32_t pos,
                    uint32_t attempts, int32_t pid, const char *what) {
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    snprintf(out, cap,
             "sample index %llu (generation %llu, position %u) failed %u attempts; last by pid "
             "%d on host %s%s",
             (unsigned long long)(spec_gen * s->swap_cap + pos), (unsigned long long)spec_gen, pos,
             attempts, (int)pid, host, what);
}

/* Area lock held: records index (spec_gen, pos)'s failure in the area, the
 * flag last (a kill before it leaves the index to be judged again). */
static void wh__fail_area(wh__shm_t *s, wh__slot_t *sl, uint64_t spec_gen, uint32_t pos,
                          uint32_t attempts, int32_t pid, const char *what, int *step) {
    wh__why(s, sl->spec_why, sizeof sl->spec_why, spec_gen, pos, attempts, pid, what);
    wh_fault_spec_step("fail", ++*step);
    __atomic_store_n(&sl->spec_failed, pos + 1, __ATOMIC_RELEASE);
    wh_fault_spec_step("fail", ++*step);
}

static bool wh__failed(const wh__slot_t *sl, wh_err_t *err) {
    char why[WH_ERR_LEN];
    wh__shm_hdr_text(why, sl->spec_why, sizeof why);
    return wh_err_set(err, WH_E_SPECFAIL, "%s", why);
}

/* Area lock held: the first position to claim (never claimed, given back,
 * or its claimer dead or expired), -1 when none. *held: positions a live
 * claimer holds. A position whose last attempt ended without a put fails
 * the area (*failed). Only index entries say what is put: a claim's state
 * is a hint a kill or damage may leave stale. */
static int wh__pick(wh__shm_t *s, int slot, uint64_t spec_gen, uint32_t max_attempts,
                    uint32_t *held, bool *failed) {
    wh__slot_t *sl = &s->hdr->slots[slot];
    wh__claim_t *cl = wh__claims(s, slot);
    const wh__entry_t *ix = wh__index(s, slot);
    uint64_t now = wh_now_real_ns();
    *failed = false;
    *held = 0;
    for (uint32_t p = 0; p < s->swap_cap; p++) {
        const wh__claim_t *c = &cl[p];
        if (__atomic_load_n(&ix[p].size, __ATOMIC_ACQUIRE)) continue;
        bool dead = !wh__pid_alive(c->pid);
        if (c->state == WH__CLAIM_HELD && !dead && !wh__expired(c, now)) {
            (*held)++;
            continue;
        }
        if (c->attempts < max_attempts) return (int)p;
        /* the last attempt ended without a put: a kill, an expired lease,
         * or (given back) fn's failure under a higher SPEC_ATTEMPTS */
        char what[64] = "";
        if (c->state == WH__CLAIM_HELD && dead)
            snprintf(what, sizeof what, ", which died holding it");
        else if (c->state == WH__CLAIM_HELD)
            snprintf(what, sizeof what, ", whose claim expired after %gs",
                     (double)wh__lease_ns(c) / 1e9);
        int step = 0;
        wh__fail_area(s, sl, spec_gen, p, c->attempts, c->pid, what, &step);
        *failed = true;
        return -1;
    }
    return -1;
}

/* Both locks held, area slot open: claims position p of it for lease_s.
 * The state store is last: a kill before it leaves the entry as it was or
 * free, naming this claimer, its attempt counted. */
static void wh__take_claim(wh__shm_t *s, int slot, uint32_t p, double lease_s, wh_claim_t *out) {
    wh__slot_t *sl = &s->hdr->slots[slot];
    wh__claim_t *c = &wh__claims(s, slot)[p];
    uint64_t spec_gen = wh__label(s, sl) - 1;
    uint32_t attempt = c->attempts + 1;
    uint64_t token = s->token + 2 * ++s->puts;
    int step = 0;
    __atomic_store_n(&c->token, token, __ATOMIC_RELEASE);
    wh_fault_spec_step("claim", ++step);
    __atomic_store_n(&c->pid, s->pid, __ATOMIC_RELEASE);
    wh_fault_spec_step("claim", ++step);
    c->lease_ms = wh__lease_ms(lease_s);
    c->expiry_ns = wh_now_real_ns() + (uint64_t)(lease_s * 1e9);
    wh_fault_spec_step("claim", ++step);
    __atomic_store_n(&c->attempts, attempt, __ATOMIC_RELEASE);
    wh_fault_spec_step("claim", ++step);
    __atomic_store_n(&c->state, WH__CLAIM_HELD, __ATOMIC_RELEASE);
    wh_fault_spec_step("claim", ++step);
    *out = (wh_claim_t){
        spec_gen * s->swap_cap + p, spec_gen, p, wh__ld(&sl->gen), sl->spec_pv, attempt, token};
}

/* Header lock held: the claim (*status OK), or why there is none. */
static bool wh__claim_locked(wh__shm_t *s, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                             wh_claim_status_t *status, wh_err_t *err) {
    wh__hdr_t *h = s->hdr;
    for (int round = 0; round < 2; round++) { /* again once when this claim sealed one */
        uint64_t pid = 0, low = wh__need_min(s, &pid);
        int slot = -1;
        *status = WH_CLAIM_WAIT;
        if (!wh__open_area_of(s, low, &slot, err)) return false;
        if (slot < 0 && !wh__open_next(s, low, status, &slot, err)) return false;
        if (slot < 0) return true;
        *status = WH_CLAIM_WAIT;
        wh__slot_t *sl = &h->slots[slot];
        if (!wh__shm_lock(&sl->lock, s->base.cfg.lease_s, err)) return false;
        bool ok = true, failed = __atomic_load_n(&sl->spec_failed, __ATOMIC_ACQUIRE) != 0;
        bool sealed = false;
        uint32_t held = 0;
        int p = -1;
        if (wh__open(s, sl)) {
            uint64_t spec_gen = wh__label(s, sl) - 1;
            p = failed ? -1 : wh__pick(s, slot, spec_gen, max_attempts, &held, &failed);
            if (p >= 0) {
                wh__take_claim(s, slot, (uint32_t)p, lease_s, out);
                *status = WH_CLAIM_OK;
            } else if (!failed && !held) { /* all put: its last put died before sealing */
                wh__seal_held(s, slot, wh__ld(&sl->gen), &sealed);
            }
        }
        if (failed) ok = wh__failed(sl, err);
        wh__shm_unlock(&sl->lock);
        if (!ok || p >= 0 || !sealed) return ok;
    }
    return true;
}

bool wh__shm_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                        wh_claim_status_t *status, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    if (!wh__shm_ready(s, NULL, 0, &e)) {
        /* BYTE_BUDGET auto, no segment yet: index 0's put creates it, sized
         * from that sample (gen 0: the put opens spec generation 0); its
         * failures are counted here, where nothing else can */
        if (e.code != WH_E_NOSTORE || st->cfg.byte_budget || st->cfg.no_create) {
            if (err) *err = e;
            return false;
        }
        if (s->first_fails >= max_attempts)
            return wh_err_set(err, WH_E_SPECFAIL, "%s", s->first_why);
        uint64_t pv = 0;
        if (!wh_pfile_version(s->pfile, &pv, err)) return false;
        *out = (wh_claim_t){0, 0, 0, 0, pv, s->first_fails + 1, s->token};
        *status = WH_CLAIM_OK;
        return true;
    }
    s->first_fails = 0; /* the segment counts attempts from here */
    if (!wh__shm_intact(s, err)) return false;
    if (!wh__shm_lock(&s->hdr->lock, st->cfg.lease_s, err)) return false;
    bool ok = wh__claim_locked(s, lease_s, max_attempts, out, status, err);
    wh__shm_unlock(&s->hdr->lock);
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
    if (wh__ld(&sl->gen) != c->gen || wh__label(s, sl) != c->spec_gen + 1) {
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
        e->lease_ms = wh__lease_ms(lease_s);
        e->expiry_ns = wh_now_real_ns() + (uint64_t)(lease_s * 1e9);
        *mine = true;
    }
    wh__shm_unlock(&s->hdr->slots[slot].lock);
    return true;
}

bool wh__shm_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts, const char *why,
                       bool *failed, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e0 = {0};
    char what[WH_ERR_LEN / 2]; /* fn's exception, cut to leave room for the rest */
    snprintf(what, sizeof what, ": %s", why);
    *failed = false;
    if (!c->gen) { /* index 0 claimed before the segment existed: counted here */
        if (c->token != s->token) return true;
        if (++s->first_fails >= max_attempts) {
            wh__why(s, s->first_why, sizeof s->first_why, 0, 0, s->first_fails, (int32_t)s->pid,
                    what);
            *failed = true;
        }
        return true;
    }
    if (!wh__shm_ready(s, NULL, 0, &e0)) {
        if (e0.code == WH_E_NOSTORE) return true; /* the store was removed: nothing to free */
        if (err) *err = e0;
        return false;
    }
    if (!wh__shm_intact(s, err)) return false;
    wh__claim_t *e;
    bool ok;
    int slot = wh__claim_area(s, c, &e, err, &ok);
    if (slot < 0) return ok;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (e->token == c->token && e->state == WH__CLAIM_HELD) {
        int step = 0;
        if (e->attempts >= max_attempts && !sl->spec_failed) {
            wh__fail_area(s, sl, c->spec_gen, c->pos, e->attempts, (int32_t)s->pid, what, &step);
            *failed = true;
        }
        __atomic_store_n(&e->state, WH__CLAIM_FREE, __ATOMIC_RELEASE); /* the next claim retries */
        wh_fault_spec_step("fail", ++step);
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
        if (wh__label(s, sl) != spec_gen + 1) continue;
        if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
        bool ok = true, complete = false;
        uint64_t g = wh__ld(&sl->gen);
        if (wh__label(s, sl) == spec_gen + 1) {
            if (wh__sealed(s, sl))
                *gen = g;
            else if (__atomic_load_n(&sl->spec_failed, __ATOMIC_ACQUIRE))
                ok = wh__failed(sl, err);
            else
                complete = __atomic_load_n(&sl->count, __ATOMIC_ACQUIRE) >= s->swap_cap;
        }
        wh__shm_unlock(&sl->lock);
        if (complete) { /* its last put died before sealing it: a reader seals it too */
            bool sealed = false;
            if (!wh__shm_spec_seal(s, i, g, &sealed, err)) return false;
            if (sealed) *gen = g;
        }
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
    if (!c->gen) {
        /* index 0 claimed before the segment existed: the side file's
         * document, if still of that version (a put of another is dropped) */
        uint64_t v = 0;
        if (!wh_pfile_get(s->pfile, &v, doc, len, err)) return false;
        if (v == c->params_version) return true;
        free(*doc);
        *doc = NULL;
        return wh_err_set(err, WH_E_GONE, "params version %llu was replaced by %llu",
                          (unsigned long long)c->params_version, (unsigned long long)v);
    }
    if (!wh__shm_ready(s, NULL, 0, &e)) {
        if (e.code == WH_E_NOSTORE)
            return wh_err_set(err, WH_E_GONE, "generation %llu was removed",
                              (unsigned long long)c->gen);
        if (err) *err = e;
        return false;
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
    uint64_t pv = sl->spec_pv;
    char *copy = malloc((size_t)WH_PARAMS_MAX + 1);
    bool good = copy && n <= WH_PARAMS_MAX && pv == c->params_version;
    if (good) {
        memcpy(copy, wh__spec_params_copy(s, slot), n);
        good = XXH3_64bits_withSeed(copy, n, pv) == sl->spec_pv_sum;
    }
    wh__shm_unlock(&sl->lock);
    if (!copy) return wh_err_set(err, WH_E_SYS, "out of memory");
    if (!good) {
        free(copy);
        return wh_err_set(err, WH_E_CORRUPT,
                          "shm store '%s': the params document (version %llu) kept for spec "
                          "generation %llu is damaged; remove the store with `wirehead-torch "
                          "clean` or wt.clean(config)",
                          s->name, (unsigned long long)c->params_version,
                          (unsigned long long)c->spec_gen);
    }
    if (!wh__shm_intact(s, err)) { /* it read zero pages, not the document */
        free(copy);
        return false;
    }
    copy[n] = 0;
    *doc = copy;
    *len = n;
    return true;
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
    if (!s->spec_off) return true;
    o->spec = true;
    o->run_seed = st->cfg.run_seed;
    o->duplicates = __atomic_load_n(&h->spec_dups, __ATOMIC_RELAXED);
    o->nondeterministic = __atomic_load_n(&h->spec_nondet, __ATOMIC_RELAXED);
    /* never blocks for long, as status: unlocked figures when stuck */
    bool locked = wh__shm_lock(&h->lock, 0.2, NULL);
    uint64_t pid = 0;
    o->floor = locked ? wh__need_min(s, &pid) : wh__ld(&h->spec_floor);
    o->reader = pid != 0;
    o->slowest = o->floor;
    o->slowest_pid = pid;
    uint64_t now = wh_now_real_ns();
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        wh__slot_t *sl = &h->slots[i];
        uint64_t l = wh__label(s, sl);
        if (!l) continue;
        if (wh__sealed(s, sl) && (!o->any_sealed || l - 1 > o->last_sealed)) {
            o->any_sealed = true;
            o->last_sealed = l - 1;
        }
        if (__atomic_load_n(&sl->spec_failed, __ATOMIC_ACQUIRE) && !o->failed) {
            o->failed = true;
            wh__shm_hdr_text(o->failure, sl->spec_why, sizeof o->failure);
        }
        if (!wh__open(s, sl)) continue;
        o->open = true;
        o->open_gen = l - 1;
        o->open_fill = __atomic_load_n(&sl->count, __ATOMIC_ACQUIRE);
        if (o->open_fill > s->swap_cap) o->open_fill = s->swap_cap;
        const wh__claim_t *cl = wh__claims(s, i);
        const wh__entry_t *ix = wh__index(s, i);
        /* the WH_SPEC_CLAIMS_SHOWN oldest, oldest first (age: since the
         * last renewal, what the lease counts) */
        for (uint32_t p = 0; p < s->swap_cap; p++) {
            if (cl[p].state != WH__CLAIM_HELD || ix[p].size) continue;
            uint64_t since = cl[p].expiry_ns - wh__lease_ns(&cl[p]);
            double age = cl[p].expiry_ns >= wh__lease_ns(&cl[p]) && since < now
                             ? (double)(now - since) / 1e9
                             : 0.0;
            int k = WH_SPEC_CLAIMS_SHOWN - 1;
            if (o->nclaims < WH_SPEC_CLAIMS_SHOWN)
                k = o->nclaims++;
            else if (o->claims[k].age_s >= age)
                continue; /* younger than every one shown */
            for (; k > 0 && o->claims[k - 1].age_s < age; k--) o->claims[k] = o->claims[k - 1];
            o->claims[k].index = (l - 1) * s->swap_cap + p;
            o->claims[k].pid = cl[p].pid > 0 ? (uint64_t)cl[p].pid : 0;
            snprintf(o->claims[k].host, sizeof o->claims[k].host, "%s", host);
            o->claims[k].age_s = age;
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
    bool ok = true;
    for (int i = 0; i < WH_SHM_AREAS && ok && !*sealed; i++) {
        uint64_t g = wh__ld(&h->slots[i].gen);
        if (!wh__open(s, &h->slots[i]) ||
            __atomic_load_n(&h->slots[i].count, __ATOMIC_ACQUIRE) < s->swap_cap)
            continue;
        ok = wh__seal_locked(s, i, g, sealed, err);
        if (*sealed) {
            info->generation = g;
            info->generated = __atomic_load_n(&h->generated, __ATOMIC_RELAXED);
            info->discarded = __atomic_load_n(&h->discarded, __ATOMIC_RELAXED);
        }
    }
    wh__shm_unlock(&h->lock);
    return ok;
}

/* The generation a put of c goes to: c->gen, or for index 0 claimed before
 * the segment existed (gen 0) the area holding its spec generation (a put
 * there after another is a duplicate), opened here when it is the one the
 * window needs next. 0: none, or one made under another params version
 * (the put is dropped as GONE and the index claimed again). */
bool wh__shm_spec_open_for(wh__shm_t *s, const wh_claim_t *c, uint64_t *gen, wh_err_t *err) {
    wh__hdr_t *h = s->hdr;
    *gen = c->gen;
    if (c->gen) return true;
    if (!wh__shm_lock(&h->lock, s->base.cfg.lease_s, err)) return false;
    uint64_t pid = 0, low = wh__need_min(s, &pid);
    int slot = -1;
    wh_claim_status_t status;
    bool ok = wh__open_area_of(s, low, &slot, err);
    if (ok && slot < 0) ok = wh__open_next(s, low, &status, &slot, err);
    for (int i = 0; ok && i < WH_SHM_AREAS; i++) {
        const wh__slot_t *sl = &h->slots[i];
        if (wh__label(s, sl) == c->spec_gen + 1 && (wh__sealed(s, sl) || wh__open(s, sl)) &&
            sl->spec_pv == c->params_version) {
            *gen = wh__ld(&sl->gen);
            break;
        }
    }
    wh__shm_unlock(&h->lock);
    return ok;
}
