/* Embedded backend: status, readers' heartbeats, and a relay's mirror of
 * another store's generation. */
#define _GNU_SOURCE
#include "wh_shm_int.h"

bool wh__shm_status(wh_store_t *st, wh_status_t *o, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err)) return false;
    wh__hdr_t *h = s->hdr;
    memset(o, 0, sizeof *o);
    /* never blocks for long: with the lock stuck (a stopped holder) the
     * figures are read without it, as a monitor needs them most then */
    bool locked = wh__shm_lock(&h->lock, 0.2, NULL);
    o->store_bytes = s->map_len;
    o->creator_pid = h->creator_pid > 0 ? (uint64_t)h->creator_pid : 0;
    wh__shm_hdr_text(o->origin_id, h->origin_id, sizeof o->origin_id);
    wh__shm_hdr_text(o->origin_name, h->origin_name, sizeof o->origin_name);
    o->read_gen = wh__ld(&h->read_gen);
    o->write_gen = wh__ld(&h->write_gen);
    int ws = wh__shm_slot_of(h, o->write_gen);
    if (ws >= 0) {
        wh__slot_t *w = &h->slots[ws];
        o->write_fill = __atomic_load_n(&w->count, __ATOMIC_ACQUIRE);
        o->write_bytes = __atomic_load_n(&w->used, __ATOMIC_RELAXED);
    }
    /* each area's generation and its live readers' pins */
    o->nareas = WH__SLOTS;
    for (int i = 0; i < WH__SLOTS; i++) {
        wh__slot_t *sl = &h->slots[i];
        o->areas[i].generation = wh__ld(&sl->gen);
        for (int j = 0; j < WH__MAX_PINNERS; j++) {
            int32_t pid = __atomic_load_n(&sl->pins[j].pid, __ATOMIC_RELAXED);
            uint32_t n = __atomic_load_n(&sl->pins[j].count, __ATOMIC_RELAXED);
            if (!pid || !n || !wh__pid_alive(pid)) continue; /* dead: pruned at a seal */
            o->areas[i].pins += n;
            o->areas[i].pinners++;
            o->areas[i].pin_pid = pid;
        }
    }
    o->swap_cap = s->swap_cap;
    o->byte_budget = s->slot_bytes;
    o->generated = __atomic_load_n(&h->generated, __ATOMIC_RELAXED);
    o->discarded = __atomic_load_n(&h->discarded, __ATOMIC_RELAXED);
    o->seals = __atomic_load_n(&h->seals, __ATOMIC_RELAXED);
    o->last_put_ns = __atomic_load_n(&h->last_put_ns, __ATOMIC_RELAXED);
    uint64_t now = wh_now_real_ns();
    if (h->leader_token && wh__pid_alive(h->leader_pid) && h->lease_expiry_ns >= now &&
        !wh__shm_lease_forged(h, now)) {
        o->leader_pid = (uint64_t)h->leader_pid;
        o->lease_left_s = (double)(h->lease_expiry_ns - now) / 1e9;
    }
    uint32_t n = h->hist_n < WH__HIST ? h->hist_n : WH__HIST;
    o->nhistory = (int)n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = (h->hist_next + WH__HIST - n + i) % WH__HIST;
        o->history[i].generation = h->hist[k].generation;
        o->history[i].time_ns = h->hist[k].time_ns;
        o->history[i].generated = h->hist[k].generated;
        o->history[i].discarded = h->hist[k].discarded;
        o->history[i].seal_ns = h->hist[k].seal_ns;
    }
    if (locked) wh__shm_unlock(&h->lock);
    for (int i = 0; i < WH__MAX_READERS; i++) {
        const wh__beat_t *e = &h->readers[i];
        wh_reader_beat_t b = {
            .token = __atomic_load_n(&e->token, __ATOMIC_ACQUIRE),
            .pid = __atomic_load_n(&e->pid, __ATOMIC_RELAXED),
            .gen = __atomic_load_n(&e->gen, __ATOMIC_RELAXED),
            .reads = __atomic_load_n(&e->reads, __ATOMIC_RELAXED),
            .gen_reads = __atomic_load_n(&e->gen_reads, __ATOMIC_RELAXED),
            .start_ns = __atomic_load_n(&e->start_ns, __ATOMIC_RELAXED),
            .beat_ns = __atomic_load_n(&e->beat_ns, __ATOMIC_ACQUIRE),
        };
        if (b.token && b.pid > 0 && b.pid <= INT32_MAX && wh__pid_alive(b.pid))
            wh_status_add_reader(o, &b, "", now);
    }
    /* figures copied out of a segment cut meanwhile are zero pages' */
    return wh__shm_intact(s, err);
}

/* A beat entry another reader may take: free, stale, or its process gone. */
static bool wh__beat_free(const wh__beat_t *e, uint64_t token, uint64_t now) {
    if (!token) return true;
    uint64_t t = __atomic_load_n(&e->beat_ns, __ATOMIC_RELAXED);
    return t + (uint64_t)(WH_READER_LIVE_S * 1e9) < now ||
           !wh__pid_alive(__atomic_load_n(&e->pid, __ATOMIC_RELAXED));
}

bool wh__shm_beat(wh_store_t *st, const wh_reader_beat_t *b, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err)) return false;
    wh__beat_t *tab = s->hdr->readers, *e = NULL;
    int take = -1;
    for (int i = 0; i < WH__MAX_READERS && !e; i++) {
        uint64_t t = __atomic_load_n(&tab[i].token, __ATOMIC_ACQUIRE);
        if (t == b->token)
            e = &tab[i];
        else if (take < 0 && wh__beat_free(&tab[i], t, b->beat_ns))
            take = i;
    }
    if (!e) {
        if (take < 0) return true; /* table full: this reader goes unlisted */
        uint64_t t = __atomic_load_n(&tab[take].token, __ATOMIC_ACQUIRE);
        if (!wh__beat_free(&tab[take], t, b->beat_ns) ||
            !__atomic_compare_exchange_n(&tab[take].token, &t, b->token, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            return true; /* lost the entry to another reader: the next beat tries again */
        e = &tab[take];
    }
    __atomic_store_n(&e->pid, b->pid, __ATOMIC_RELAXED);
    __atomic_store_n(&e->gen, b->gen, __ATOMIC_RELAXED);
    __atomic_store_n(&e->reads, b->reads, __ATOMIC_RELAXED);
    __atomic_store_n(&e->gen_reads, b->gen_reads, __ATOMIC_RELAXED);
    __atomic_store_n(&e->start_ns, b->start_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&e->beat_ns, b->beat_ns, __ATOMIC_RELEASE);
    return true;
}

/* A closed reader leaves the list at once. */
void wh__shm_beat_drop(wh__shm_t *s) {
    uint64_t token = s->base.beat.token;
    if (!s->hdr || !token) return;
    for (int i = 0; i < WH__MAX_READERS; i++) {
        uint64_t t = token;
        if (__atomic_compare_exchange_n(&s->hdr->readers[i].token, &t, 0, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
    }
}

/* ---- a relay's mirror of another store's generation (wh_backend.h) ----
 *
 * Only the lease holder (the one relay of a node) writes. The write area
 * is freed and relabelled in the order a seal uses, so a kill at any point
 * leaves the read generation as it was; areas holding a generation newer
 * than the read one are never reachable by readers, and the next begin
 * frees them. */

static bool wh__mirror_hold(wh__shm_t *s, wh_err_t *err) {
    bool leader = false;
    if (!wh__shm_lead(&s->base, &leader, err)) return false;
    if (!leader)
        return wh_err_set(err, WH_E_LEASE,
                          "shm store '%s' is filled by another relay (pid %lld); one relay "
                          "per node",
                          s->shm_name + 10, (long long)s->hdr->leader_pid);
    return true;
}

static wh__shm_t *wh__mirror_store(wh_store_t *st, wh_err_t *err) {
    if (st->ops != &wh__shm_ops)
        return wh_err_set(err, WH_E_INVALID, "a relay mirrors into an shm:// store only"), NULL;
    return (wh__shm_t *)st;
}

bool wh_shm_mirror_begin(wh_store_t *st, uint64_t gen, uint64_t budget, wh_err_t *err) {
    wh__shm_t *s = wh__mirror_store(st, err);
    if (!s) return false;
    wh_err_t e = {0};
    if (!wh__shm_ready(s, NULL, 0, &e)) {
        if (e.code != WH_E_NOSTORE || !budget) {
            if (err) *err = e;
            return false;
        }
        if (!wh__shm_connect(s, budget, err)) return false;
    }
    if (!wh__shm_intact(s, err) || !wh__mirror_hold(s, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh__shm_lock(&h->lock, st->cfg.lease_s, err)) return false;
    uint64_t rg = wh__ld(&h->read_gen);
    bool ok = true;
    wh_seal_info_t info = {0};
    int pick = -1;
    if (gen <= rg) {
        ok = wh_err_set(err, WH_E_INVALID,
                        "generation %llu is not newer than the local read generation %llu",
                        (unsigned long long)gen, (unsigned long long)rg);
        goto out;
    }
    for (int i = 0; ok && i < WH__SLOTS; i++) {
        wh__slot_t *sl = &h->slots[i];
        if (wh__ld(&sl->gen) <= rg) continue;
        if (!(ok = wh__shm_lock(&sl->lock, st->cfg.lease_s, err))) break;
        if (wh__ld(&sl->gen) > rg) wh__st(&sl->gen, 0);
        wh__shm_unlock(&sl->lock);
    }
    /* no area holds gen now: every area but the read one is a candidate */
    if (!ok || !(ok = wh__shm_take_next_slot(h, st->cfg.lease_s, gen, &info, &pick, err))) goto out;
    if (pick < 0) {
        ok = wh_err_set(err, WH_E_PINNED,
                        "shm store '%s': readers pin every free area (pid %llu holds "
                        "generation %llu)",
                        s->shm_name + 10, (unsigned long long)info.blocked_pid,
                        (unsigned long long)info.blocked_gen);
        goto out;
    }
    wh__slot_t *sl = &h->slots[pick]; /* locked by wh__shm_take_next_slot */
    wh__st(&sl->gen, 0);
    __atomic_store_n(&sl->count, 0, __ATOMIC_RELEASE);
    wh__st(&sl->used, 0);
    __atomic_store_n(&sl->nholes, 0, __ATOMIC_RELEASE);
    wh__st(&sl->gen, gen);
    wh__shm_unlock(&sl->lock);
    wh__st(&h->write_gen, gen); /* a seal now publishes gen */
out:
    wh__shm_unlock(&h->lock);
    return ok;
}

/* The area of write generation gen, or an error saying the relay lost it. */
static int wh__mirror_slot(wh__shm_t *s, uint64_t gen, wh_err_t *err) {
    int slot = wh__shm_slot_of(s->hdr, gen);
    if (slot < 0 || wh__ld(&s->hdr->write_gen) != gen)
        return wh_err_set(err, WH_E_LEASE,
                          "shm store '%s': generation %llu is no longer being filled here "
                          "(another relay took the store over)",
                          s->shm_name + 10, (unsigned long long)gen),
               -1;
    return slot;
}

bool wh_shm_mirror_reserve(wh_store_t *st, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                           wh_err_t *err) {
    wh__shm_t *s = wh__mirror_store(st, err);
    if (!s || !wh__shm_ready(s, NULL, 0, err) || !wh__shm_intact(s, err) ||
        !wh__mirror_hold(s, err))
        return false;
    int slot = wh__mirror_slot(s, gen, err);
    if (slot < 0) return false;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
    bool ok = true;
    if (sl->count != pos || pos >= s->swap_cap) {
        ok = wh_err_set(err, WH_E_INVALID, "mirror of generation %llu: position %u out of order",
                        (unsigned long long)gen, pos);
    } else if (size > s->slot_bytes || sl->used > s->slot_bytes - size) {
        ok = wh_err_set(err, WH_E_TOOBIG,
                        "local cache '%s': generation %llu does not fit an area of %llu bytes "
                        "(sized from the first generation mirrored); samples grew: remove the "
                        "local store (`wirehead-torch clean` on its shm:// name) and restart "
                        "the relay",
                        s->shm_name + 10, (unsigned long long)gen,
                        (unsigned long long)s->slot_bytes);
    } else {
        s->mirror_off = sl->used;
        s->mirror_size = size;
        wh__st(&sl->used, sl->used + size);
        *dst = wh__data(s, slot) + s->mirror_off;
    }
    wh__shm_unlock(&sl->lock);
    return ok;
}

bool wh_shm_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err) {
    wh__shm_t *s = wh__mirror_store(st, err);
    if (!s || !wh__shm_ready(s, NULL, 0, err) || !wh__shm_intact(s, err)) return false;
    int slot = wh__mirror_slot(s, gen, err);
    if (slot < 0) return false;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
    bool ok = wh__ld(&sl->gen) == gen && sl->count == pos && s->mirror_size &&
              s->mirror_off + s->mirror_size <= sl->used;
    if (ok) {
        wh__entry_t *e = &wh__index(s, slot)[pos];
        e->off = s->mirror_off;
        e->size = s->mirror_size;
        __atomic_store_n(&sl->count, pos + 1, __ATOMIC_RELEASE); /* commit point */
        __atomic_fetch_add(&s->hdr->generated, 1, __ATOMIC_RELAXED);
    } else {
        wh_err_set(err, WH_E_INVALID, "mirror of generation %llu: position %u was not reserved",
                   (unsigned long long)gen, pos);
    }
    s->mirror_size = 0;
    wh__shm_unlock(&sl->lock);
    return ok;
}
