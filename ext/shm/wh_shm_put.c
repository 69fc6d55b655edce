/* Embedded backend: areas and puts (an area's bookkeeping checked, holes,
 * writers' reservations, put). */
#define _GNU_SOURCE
#include "wh_shm_int.h"

/* An area's bookkeeping checked against the store's own limits before a
 * put trusts it (slot lock held): forged counts or offsets are an error. */
bool wh__shm_slot_sane(const wh__shm_t *s, const wh__slot_t *sl, int slot, wh_err_t *err) {
    const char *bad = NULL;
    uint64_t end;
    if (sl->used > s->slot_bytes)
        bad = "used bytes beyond the area";
    else if (sl->count > s->swap_cap)
        bad = "more samples than SWAP_CAP";
    else if (sl->nholes > WH__MAX_HOLES)
        bad = "hole count";
    else if (sl->nwriters > WH__MAX_WRITERS)
        bad = "writer count";
    for (uint32_t i = 0; !bad && i < sl->nholes; i++)
        if (!wh_add_ok(sl->holes[i].off, sl->holes[i].size, &end) || end > sl->used)
            bad = "a hole outside the used bytes";
    for (int i = 0; !bad && i < WH__MAX_WRITERS; i++)
        if (sl->writers[i].pid &&
            (!wh_add_ok(sl->writers[i].off, sl->writers[i].size, &end) || end > sl->used))
            bad = "a reservation outside the used bytes";
    if (bad)
        return wh_err_set(err, WH_E_CORRUPT,
                          "shm store '%s' area %d is damaged (%s); remove "
                          "it with `wirehead-torch clean` or wt.clean(config)",
                          s->name, slot, bad);
    return true;
}

/* Slot lock held for all of these. A holder killed between two stores
 * leaves its lock to the next taker, so each store leaves a usable state:
 * a hole is filled in before it is counted, and a writer entry is cleared
 * before its bytes become a hole (a kill between loses those bytes until
 * the area is reused; the other order would hand them out twice). */
static void wh__add_hole(wh__slot_t *sl, uint64_t off, uint64_t size) {
    uint32_t n = sl->nholes;
    if (!size || n >= WH__MAX_HOLES) return;
    sl->holes[n] = (wh__hole_t){off, size};
    __atomic_store_n(&sl->nholes, n + 1, __ATOMIC_RELEASE);
}

void wh__shm_end_writer(wh__slot_t *sl, int i, bool keep_bytes) {
    wh__writer_t wr = sl->writers[i];
    __atomic_store_n(&sl->writers[i].pid, 0, __ATOMIC_RELEASE);
    if (sl->nwriters) sl->nwriters--;
    if (!keep_bytes) wh__add_hole(sl, wr.off, wr.size);
}

/* Drops reservations of processes that no longer exist; their bytes become
 * holes for later puts. Recounts the rest: a holder killed inside
 * wh__end_writer or a put may have left nwriters off, and a seal waits for
 * nwriters to reach 0. */
void wh__shm_prune_writers(wh__slot_t *sl) {
    uint32_t n = 0;
    for (int i = 0; i < WH__MAX_WRITERS; i++) {
        if (sl->writers[i].pid && !wh__pid_alive(sl->writers[i].pid))
            wh__shm_end_writer(sl, i, false);
        n += sl->writers[i].pid != 0;
    }
    sl->nwriters = n;
}

/* First fit among the holes, else the end of the area. */
bool wh__shm_reserve(wh__slot_t *sl, uint64_t cap, uint64_t size, uint64_t *off) {
    for (uint32_t i = 0; i < sl->nholes; i++) {
        wh__hole_t *h = &sl->holes[i];
        if (h->size < size) continue;
        /* shrink before moving, count before copying: a kill between two
         * of these stores loses bytes, never lists them twice */
        uint64_t at = h->off;
        __atomic_store_n(&h->size, h->size - size, __ATOMIC_RELEASE);
        __atomic_store_n(&h->off, at + size, __ATOMIC_RELEASE);
        if (!h->size) {
            uint32_t n = sl->nholes - 1;
            __atomic_store_n(&sl->nholes, n, __ATOMIC_RELEASE);
            sl->holes[i] = sl->holes[n];
        }
        *off = at;
        return true;
    }
    if (size > cap || sl->used > cap - size) return false;
    *off = sl->used;
    sl->used += size;
    return true;
}

int wh__shm_take_writer(wh__slot_t *sl, pid_t pid) {
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < WH__MAX_WRITERS; i++) {
            if (!sl->writers[i].pid) {
                /* no bytes until the put records its reservation: a kill
                 * before that must not make a previous put's bytes a hole */
                sl->writers[i].off = sl->writers[i].size = 0;
                __atomic_store_n(&sl->writers[i].pid, pid, __ATOMIC_RELEASE);
                sl->nwriters++;
                return i;
            }
        }
        wh__shm_prune_writers(sl);
    }
    return -1;
}

bool wh__shm_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                 wh_put_status_t *status, uint64_t *genp, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_sample_meta_t meta;
    if (!wh__shm_ready(s, arr, n, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh_sample_plan(&st->cfg.schema, arr, n, &meta, err) || !wh__shm_intact(s, err))
        return false;
    meta.params_version = st->put_params;
    uint64_t size = meta.total_size;
    if (size > s->slot_bytes)
        return wh_err_set(err, WH_E_TOOBIG,
                          "sample of %llu bytes does not fit a generation's BYTE_BUDGET of %llu "
                          "bytes; raise BYTE_BUDGET to at least SWAP_CAP x sample size (%llu) "
                          "(the budget is fixed when the store is created: `wirehead-torch "
                          "clean` first)",
                          (unsigned long long)size, (unsigned long long)s->slot_bytes,
                          (unsigned long long)size * s->swap_cap);
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)wait_ms * 1000000ull;
    uint64_t gen, off = 0;
    int slot, wi;
    for (;;) {
        gen = wh__ld(&h->write_gen);
        slot = wh__shm_slot_of(h, gen);
        if (slot < 0) { /* a seal is switching slots */
            if (wh_now_mono_ns() >= deadline) {
                *status = WH_PUT_WAIT;
                return true;
            }
            wh_sleep_ms(1);
            continue;
        }
        wh__slot_t *sl = &h->slots[slot];
        if (genp) *genp = gen;
        if (__atomic_load_n(&sl->count, __ATOMIC_ACQUIRE) >= s->swap_cap) {
            __atomic_fetch_add(&h->discarded, 1, __ATOMIC_RELAXED);
            wh__put_seen(h);
            *status = WH_PUT_DISCARDED;
            return true;
        }
        if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
        if (!wh__shm_slot_sane(s, sl, slot, err)) {
            wh__shm_unlock(&sl->lock);
            return false;
        }
        if (wh__ld(&sl->gen) != gen) { /* a seal is switching slots */
            wh__shm_unlock(&sl->lock);
            continue;
        }
        if (sl->count >= s->swap_cap) {
            wh__shm_unlock(&sl->lock);
            __atomic_fetch_add(&h->discarded, 1, __ATOMIC_RELAXED);
            wh__put_seen(h);
            *status = WH_PUT_DISCARDED;
            return true;
        }
        wi = wh__shm_take_writer(sl, s->pid);
        if (wi >= 0) sl->writers[wi].token = s->token + 2 * ++s->puts;
        bool fits = false;
        if (wi >= 0) {
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
        if (!fits && busy == 0)
            return wh_err_set(err, WH_E_TOOBIG,
                              "generation %llu filled its BYTE_BUDGET of %llu bytes with only "
                              "%u of SWAP_CAP=%u samples; raise BYTE_BUDGET to at least "
                              "SWAP_CAP x sample size (%llu bytes) after `wirehead-torch clean` or "
                              "wt.clean(config)",
                              (unsigned long long)gen, (unsigned long long)s->slot_bytes, count,
                              s->swap_cap, (unsigned long long)size * s->swap_cap);
        /* Backpressure: wait for in-flight puts to commit or a seal. */
        if (wh_now_mono_ns() >= deadline) {
            *status = WH_PUT_WAIT;
            return true;
        }
        wh_sleep_ms(1);
    }
    wh__slot_t *sl = &h->slots[slot];
    char *dst = wh__data(s, slot) + off;
    bool ok = wh_sample_encode(dst, size, &st->cfg.schema, arr, &meta, true, err);
    if (!wh__shm_lock(&sl->lock, st->cfg.lease_s, err)) return false;
    uint64_t token = s->token + 2 * s->puts;
    bool mine = sl->writers[wi].pid == s->pid && sl->writers[wi].token == token;
    /* an entry pruned under us means the bytes may have been handed out again */
    bool commit = mine && ok && wh__ld(&sl->gen) == gen && sl->count < s->swap_cap;
    if (mine) wh__shm_end_writer(sl, wi, commit);
    if (commit) {
        wh_sample_set_place(dst, &meta, gen, sl->count); /* before the commit point */
        wh__entry_t *e = &wh__index(s, slot)[sl->count];
        e->off = off;
        e->size = size;
        __atomic_store_n(&sl->count, sl->count + 1, __ATOMIC_RELEASE); /* commit point */
        __atomic_fetch_add(&h->generated, 1, __ATOMIC_RELAXED);
        wh__put_seen(h);
        *status = WH_PUT_ACCEPTED;
    } else if (ok) {
        __atomic_fetch_add(&h->discarded, 1, __ATOMIC_RELAXED);
        wh__put_seen(h);
        *status = WH_PUT_DISCARDED;
    }
    wh__shm_unlock(&sl->lock);
    return ok;
}
