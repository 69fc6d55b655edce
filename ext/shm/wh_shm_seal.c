/* Embedded backend: the lease and the seal (the next write area chosen
 * among unpinned ones, dead writers' reservations and readers' pins
 * pruned by their rooms). */
#define _GNU_SOURCE
#include "wh_shm_int.h"

/* A lease runs at most its holder's LEASE_SECONDS (itself at most
 * WH_SECONDS_MAX) from now: an expiry further out (a damaged segment,
 * leader_pid 1 with a far expiry) would block takeover for ever, so it
 * counts as expired. */
bool wh__shm_lease_forged(const wh__hdr_t *h, uint64_t now) {
    const uint64_t max_ns = (uint64_t)(WH_SECONDS_MAX * 1e9);
    uint64_t ns = h->lease_ns < max_ns ? h->lease_ns : max_ns;
    return h->lease_expiry_ns > now + ns + (uint64_t)1e9;
}

bool wh__shm_lead(wh_store_t *st, bool *leader, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh__shm_lock(&h->lock, st->cfg.lease_s, err)) return false;
    uint64_t now = wh_now_real_ns();
    bool mine = h->leader_token == s->token;
    bool free_ = !h->leader_token || !wh__pid_alive(h->leader_pid) || h->lease_expiry_ns < now ||
                 wh__shm_lease_forged(h, now);
    if (mine || free_) {
        h->leader_pid = s->pid;
        h->leader_token = s->token;
        h->lease_ns = (uint64_t)(st->cfg.lease_s * 1e9);
        h->lease_expiry_ns = now + h->lease_ns;
    }
    *leader = mine || free_;
    wh__shm_unlock(&h->lock);
    return true;
}

bool wh__shm_resign(wh_store_t *st, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    if (!h) return true; /* not attached: no lease of ours to give up */
    if (!wh__shm_lock(&h->lock, st->cfg.lease_s, err)) return false;
    if (h->leader_token == s->token) {
        h->leader_token = 0;
        h->leader_pid = 0;
        h->lease_expiry_ns = 0;
    }
    wh__shm_unlock(&h->lock);
    return true;
}

/* The slot the next write generation takes: among slots holding neither
 * the write generation w nor the read generation, the oldest one with no
 * live writer and no live reader pin. Returns it locked in *out, or -1 with
 * info naming a pid that keeps the candidates busy (a reader's pin when
 * that is what blocks). */
bool wh__shm_take_next_slot(wh__hdr_t *h, double wait_s, uint64_t w, wh_seal_info_t *info, int *out,
                            wh_err_t *err) {
    uint64_t rg = wh__ld(&h->read_gen);
    int order[WH_SHM_AREAS], n = 0;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        uint64_t g = wh__ld(&h->slots[i].gen);
        if (g == w || (g && g == rg)) continue;
        int k = n++;
        while (k > 0 && wh__ld(&h->slots[order[k - 1]].gen) > g) { /* oldest first */
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    *out = -1;
    for (int k = 0; k < n; k++) {
        wh__slot_t *sl = &h->slots[order[k]];
        if (!wh__shm_lock(&sl->lock, wait_s, err)) return false;
        wh__shm_prune_writers(sl);
        wh__shm_prune_pins(sl);
        if (!sl->nwriters && !sl->npinners) {
            *out = order[k];
            return true;
        }
        for (int i = 0; i < WH__MAX_WRITERS && sl->nwriters; i++)
            if (sl->writers[i].pid) {
                info->blocked_pid = (uint64_t)sl->writers[i].pid;
                info->blocked_reader = false;
            }
        if (!sl->nwriters)
            for (int i = 0; i < WH__MAX_PINNERS; i++)
                if (sl->pins[i].pid) {
                    info->blocked_pid = (uint64_t)sl->pins[i].pid;
                    info->blocked_reader = true;
                    info->blocked_gen = wh__ld(&sl->gen);
                }
        wh__shm_unlock(&sl->lock);
    }
    return true;
}

/* A seal's writes, in order, each one store (a kill may stop it after any
 * of them; wh_fault_seal_step numbers them as they happen, so after a
 * repair each step below is one later):
 *   repair: an area holding a generation newer than write_gen w (the target
 *           of a seal killed before its last store, never reachable by
 *           puts or reads) is made free again (gen 0)
 *   1 next->gen = 0        its old generation is gone (readers see GONE); a
 *                          kill from here leaves a free area, taken first
 *   2-4 count, used, nholes = 0
 *   5 next->gen = w + 1    the area is ready; puts still go to w's area
 *   6 read_gen = w         w is full: readers may take it as it is
 *   7 write_gen = w + 1    the commit point: puts go to the new area
 *   then seals and the history (counters only).
 * Every prefix is therefore the old state, the new one, or the old state
 * with w readable early and one unreachable area, which the repair puts
 * back; no area is ever given a generation another area holds. */
static void wh__seal_store(uint64_t *p, uint64_t v, int *step) {
    wh__st(p, v);
    wh_fault_seal_step(++*step);
}

bool wh__shm_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err)) return false;
    wh__hdr_t *h = s->hdr;
    *sealed = false;
    uint64_t t0 = wh_now_mono_ns();
    int step = 0;
    if (!wh__shm_lock(&h->lock, st->cfg.lease_s, err)) return false;
    if (h->leader_token != s->token || h->lease_expiry_ns < wh_now_real_ns()) {
        wh__shm_unlock(&h->lock);
        return wh_err_set(err, WH_E_LEASE, "seal: this manager does not hold the lease");
    }
    uint64_t w = wh__ld(&h->write_gen);
    int cs = wh__shm_slot_of(h, w);
    bool ok = true;
    if (cs < 0) {
        ok = wh_err_set(err, WH_E_CORRUPT, "shm: no area holds write generation %llu",
                        (unsigned long long)w);
        goto out;
    }
    if (__atomic_load_n(&h->slots[cs].count, __ATOMIC_ACQUIRE) < s->swap_cap) goto out;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
        wh__slot_t *sl = &h->slots[i];
        if (wh__ld(&sl->gen) <= w) continue;
        if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) {
            ok = false;
            goto out;
        }
        if (wh__ld(&sl->gen) > w) wh__seal_store(&sl->gen, 0, &step);
        wh__shm_unlock(&sl->lock);
    }
    int ns = -1;
    if (!wh__shm_take_next_slot(h, st->cfg.lease_s, w, info, &ns, err)) {
        ok = false;
        goto out;
    }
    if (ns < 0) goto out;             /* every candidate is busy: info names who */
    wh__slot_t *next = &h->slots[ns]; /* locked by wh__shm_take_next_slot */
    wh__seal_store(&next->gen, 0, &step);
    __atomic_store_n(&next->count, 0, __ATOMIC_RELEASE);
    wh_fault_seal_step(++step);
    wh__seal_store(&next->used, 0, &step);
    __atomic_store_n(&next->nholes, 0, __ATOMIC_RELEASE);
    wh_fault_seal_step(++step);
    wh__seal_store(&next->gen, w + 1, &step);
    wh__shm_unlock(&next->lock);
    wh__seal_store(&h->read_gen, w, &step);
    wh__seal_store(&h->write_gen, w + 1, &step);
    __atomic_add_fetch(&h->seals, 1, __ATOMIC_RELAXED);
    info->generation = w;
    info->generated = __atomic_load_n(&h->generated, __ATOMIC_RELAXED);
    info->discarded = __atomic_load_n(&h->discarded, __ATOMIC_RELAXED);
    info->seal_ns = wh_now_mono_ns() - t0;
    uint32_t k = h->hist_next % WH__HIST;
    h->hist[k].generation = w;
    h->hist[k].time_ns = wh_now_real_ns();
    h->hist[k].generated = info->generated;
    h->hist[k].discarded = info->discarded;
    h->hist[k].seal_ns = info->seal_ns;
    /* the entry before its index: a kill here loses one history line */
    __atomic_store_n(&h->hist_next, (k + 1) % WH__HIST, __ATOMIC_RELEASE);
    if (h->hist_n < WH__HIST) __atomic_store_n(&h->hist_n, h->hist_n + 1, __ATOMIC_RELEASE);
    *sealed = true;
out:
    wh__shm_unlock(&h->lock);
    return ok;
}
