/* Embedded backend: a relay's mirror of another store's generation
 * (wh_store_mirror_begin and the rest, wh_store.h; docs/relay.md).
 *
 * Only the lease holder (the one relay of a node) writes. The write area
 * is freed and relabelled in the order a seal uses, so a kill at any point
 * leaves the read generation as it was; areas holding a generation newer
 * than the read one are never reachable by readers, and the next begin
 * frees them. */
#define _GNU_SOURCE
#include "wh_shm_int.h"

static bool wh__mirror_hold(wh__shm_t *s, wh_err_t *err) {
    bool leader = false;
    if (!wh__shm_lead(&s->base, &leader, err)) return false;
    if (!leader)
        return wh_err_set(err, WH_E_LEASE,
                          "shm store '%s' is filled by another relay (pid %lld); one relay "
                          "per node",
                          s->name, (long long)s->hdr->leader_pid);
    return true;
}

bool wh__shm_mirror_begin(wh_store_t *st, uint64_t gen, uint64_t budget, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
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
    for (int i = 0; ok && i < WH_SHM_AREAS; i++) {
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
                        s->name, (unsigned long long)info.blocked_pid,
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
                          s->name, (unsigned long long)gen),
               -1;
    return slot;
}

bool wh__shm_mirror_reserve(wh_store_t *st, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                            wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err) || !wh__shm_intact(s, err) || !wh__mirror_hold(s, err))
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
                        s->name, (unsigned long long)gen, (unsigned long long)s->slot_bytes);
    } else {
        s->mirror_off = sl->used;
        s->mirror_size = size;
        wh__st(&sl->used, sl->used + size);
        *dst = wh__data(s, slot) + s->mirror_off;
    }
    wh__shm_unlock(&sl->lock);
    return ok;
}

bool wh__shm_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err) || !wh__shm_intact(s, err)) return false;
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
