/* Embedded backend: status and readers' heartbeats. */
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
    o->nareas = WH_SHM_AREAS;
    for (int i = 0; i < WH_SHM_AREAS; i++) {
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
    __atomic_store_n(&e->need, b->need, __ATOMIC_RELAXED);
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
