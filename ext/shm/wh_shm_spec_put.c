/* Embedded backend, spec mode: the put of a sample at its index's
 * position (docs/reproducible.md), with the put's reservations
 * (wh_shm_put.c) and the area its claim names (wh_shm_spec.c). The first
 * complete put of a position wins; the one that completes a generation
 * seals it. */
#define _GNU_SOURCE
#include "wh_shm_int.h"

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
    if (!wh__shm_spec_holds(s, sl, gen, c)) {
        wh__shm_unlock(&sl->lock);
        return -1;
    }
    return slot;
}

static int wh__by_off(const void *a, const void *b) {
    uint64_t x = ((const wh__hole_t *)a)->off, y = ((const wh__hole_t *)b)->off;
    return x < y ? -1 : x > y;
}
static int wh__by_size_desc(const void *a, const void *b) {
    uint64_t x = ((const wh__hole_t *)a)->size, y = ((const wh__hole_t *)b)->size;
    return x > y ? -1 : x < y;
}

/* Area lock held, no live writer with bytes: every byte no committed
 * position holds is free again. A put killed between reserving bytes and
 * recording them lost them, and with a BYTE_BUDGET of SWAP_CAP samples its
 * generation could never complete. The holes are rebuilt from the index
 * (the largest WH__MAX_HOLES gaps) and used ends at the last entry; each
 * store leaves a sane area, at worst with bytes lost again. */
static void wh__spec_free_lost(wh__shm_t *s, int slot) {
    wh__slot_t *sl = &s->hdr->slots[slot];
    const wh__entry_t *ix = wh__index(s, slot);
    wh__hole_t *held = malloc(((size_t)s->swap_cap + 1) * sizeof *held);
    if (!held) return;
    uint32_t n = 0, ngaps = 0;
    for (uint32_t p = 0; p < s->swap_cap; p++) {
        wh__entry_t e = ix[p];
        if (e.size && e.off <= s->slot_bytes && e.size <= s->slot_bytes - e.off)
            held[n++] = (wh__hole_t){e.off, e.size};
    }
    qsort(held, n, sizeof *held, wh__by_off);
    uint64_t end = 0;
    for (uint32_t i = 0; i < n; i++) { /* the gaps, in place: never more than the entries */
        wh__hole_t h = held[i];
        if (h.off > end) held[ngaps++] = (wh__hole_t){end, h.off - end};
        if (h.off + h.size > end) end = h.off + h.size;
    }
    qsort(held, ngaps, sizeof *held, wh__by_size_desc);
    if (ngaps > WH__MAX_HOLES) ngaps = WH__MAX_HOLES;
    __atomic_store_n(&sl->nholes, 0, __ATOMIC_RELEASE);
    wh__st(&sl->used, end);
    for (uint32_t i = 0; i < ngaps; i++) sl->holes[i] = held[i];
    __atomic_store_n(&sl->nholes, ngaps, __ATOMIC_RELEASE);
    free(held);
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
    if (!wh__shm_spec_open_for(s, c, &gen, err)) return false;
    if (!gen) return true; /* another spec generation is open: this one is not needed now */
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)(st->cfg.lease_s * 1e9);
    int slot, wi, step = 0; /* wh_fault_spec_step's, numbered on from a retry */
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
            wh_fault_spec_step("put", ++step);
            sl->writers[wi].token = s->token + 2 * ++s->puts;
            fits = wh__shm_reserve(sl, s->slot_bytes, size, &off);
            if (!fits) {
                wh__shm_prune_writers(sl);
                fits = wh__shm_reserve(sl, s->slot_bytes, size, &off);
            }
            if (!fits && sl->nwriters == 1) { /* only this put (no bytes yet): bytes lost? */
                wh__spec_free_lost(s, slot);
                fits = wh__shm_reserve(sl, s->slot_bytes, size, &off);
            }
            wh_fault_spec_step("put", ++step);
            if (fits) {
                sl->writers[wi].off = off;
                sl->writers[wi].size = size;
                wh_fault_spec_step("put", ++step);
                wh__shm_unlock(&sl->lock);
                break;
            }
            sl->writers[wi].pid = 0;
            sl->nwriters--;
        }
        uint32_t busy = sl->nwriters, count = sl->count;
        wh__shm_unlock(&sl->lock);
        if (busy && wh_now_mono_ns() >= deadline)
            return wh_err_set(err, WH_E_TIMEOUT,
                              "spec generation %llu: no room for sample index %llu while %u other "
                              "puts hold its area's bytes for more than %gs (stopped "
                              "processes?)",
                              (unsigned long long)c->spec_gen, (unsigned long long)c->index, busy,
                              st->cfg.lease_s);
        if (busy == 0)
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
    /* Each store below leaves a usable state if the put dies after it: the
     * commit point is the index entry's size (a kill before it leaves the
     * position free for the next claim; one after it, the count short, which
     * the next claim recounts before it seals). */
    uint64_t token = s->token + 2 * s->puts;
    bool mine = sl->writers[wi].pid == s->pid && sl->writers[wi].token == token;
    bool here = wh__shm_spec_holds(s, sl, gen, c);
    wh__entry_t *e = &wh__index(s, slot)[c->pos];
    bool commit = mine && ok && here && !e->size;
    if (ok && mine && here && e->size) {
        *status = wh__dup(s, slot, gen, c->pos, &meta);
        wh__count_dup(s->hdr, *status);
    }
    if (mine) wh__shm_end_writer(sl, wi, commit);
    wh_fault_spec_step("put", ++step);
    if (commit) {
        wh_sample_set_place(dst, &meta, gen, c->pos); /* before the commit point */
        e->off = off;
        wh_fault_spec_step("put", ++step);
        __atomic_store_n(&e->size, size, __ATOMIC_RELEASE); /* the commit point */
        wh_fault_spec_committed();
        wh_fault_spec_step("put", ++step);
        __atomic_store_n(&wh__claims(s, slot)[c->pos].state, WH__CLAIM_DONE, __ATOMIC_RELAXED);
        wh_fault_spec_step("put", ++step);
        uint32_t n = __atomic_load_n(&sl->count, __ATOMIC_RELAXED);
        if (n < s->swap_cap) __atomic_store_n(&sl->count, n + 1, __ATOMIC_RELEASE);
        wh_fault_spec_step("put", ++step);
        __atomic_fetch_add(&s->hdr->generated, 1, __ATOMIC_RELAXED);
        wh__put_seen(s->hdr);
        *status = WH_SPEC_PUT_ACCEPTED;
    }
    uint32_t count = sl->count;
    wh__shm_unlock(&sl->lock);
    if (!ok) return false;
    if (commit && count >= s->swap_cap) return wh__shm_spec_seal(s, slot, gen, sealed, err);
    return true;
}
