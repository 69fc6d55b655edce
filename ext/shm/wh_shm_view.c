/* Embedded backend: reads, store-backed views and reader pins, and what a
 * forked child inherits. */
#define _GNU_SOURCE
#include "wh_shm_int.h"

/* Whether position pos of gen in area slot was verified by this process
 * (a sealed area is not written while it holds gen). */
static bool wh__memo_has(wh__map_t *m, int slot, uint64_t gen, uint32_t pos) {
    pthread_mutex_lock(&m->memo_mu);
    bool has =
        m->memo[slot] && m->memo_gen[slot] == gen && (m->memo[slot][pos >> 3] >> (pos & 7)) & 1;
    pthread_mutex_unlock(&m->memo_mu);
    return has;
}

static void wh__memo_set(wh__map_t *m, int slot, uint64_t gen, uint32_t pos, uint32_t cap) {
    pthread_mutex_lock(&m->memo_mu);
    if (!m->memo[slot]) m->memo[slot] = calloc(((size_t)cap + 7) / 8, 1);
    if (m->memo[slot]) {
        if (m->memo_gen[slot] != gen) memset(m->memo[slot], 0, ((size_t)cap + 7) / 8);
        m->memo_gen[slot] = gen;
        m->memo[slot][pos >> 3] |= (uint8_t)(1u << (pos & 7));
    }
    pthread_mutex_unlock(&m->memo_mu);
}

bool wh__shm_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    *gen = 0;
    if (!wh__shm_ready(s, NULL, 0, &e)) { /* no store yet: no generation yet */
        if (e.code == WH_E_NOSTORE) return true;
        if (err) *err = e;
        return false;
    }
    if (!wh__shm_intact(s, err)) return false; /* zero pages would read as "no generation yet" */
    *gen = wh__ld(&s->hdr->read_gen);
    return true;
}

static bool wh__gone(uint64_t gen, wh_err_t *err) { return wh_store_err_gone(err, gen); }

/* Slot of sealed generation gen: NOTFOUND if not sealed yet, GONE if its
 * slot was recycled. */
static bool wh__sealed_slot(wh__shm_t *s, uint64_t gen, int *slot, wh_err_t *err) {
    const wh__hdr_t *h = s->hdr;
    uint64_t rg = wh__ld(&h->read_gen);
    if (gen == 0 || gen > rg) {
        /* newer than this segment's newest: perhaps sealed in one made again
         * under the name, so the next operation looks at the name at once
         * (wh__shm_ready), not up to a second later */
        if (gen) s->checked_ns = 0;
        return wh_err_set(err, WH_E_NOTFOUND, "generation %llu is not sealed (newest is %llu)",
                          (unsigned long long)gen, (unsigned long long)rg);
    }
    *slot = wh__shm_slot_of(h, gen);
    return *slot >= 0 || wh__gone(gen, err);
}

/* A read of an attached handle (wh__shm_ready done by the caller). */
static bool wh__read_attached(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                              wh_sample_meta_t *meta_out, wh_err_t *err);

bool wh__shm_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                  wh_sample_meta_t *meta_out, wh_err_t *err) {
    if (!wh__shm_ready((wh__shm_t *)st, NULL, 0, err)) return false;
    return wh__read_attached(st, gen, pos, fn, ctx, meta_out, err);
}

static bool wh__read_attached(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                              wh_sample_meta_t *meta_out, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    const wh_schema_t *schema = &st->cfg.schema;
    int slot;
    if (!wh__shm_intact(s, err) || !wh__sealed_slot(s, gen, &slot, err)) return false;
    wh__slot_t *sl = &h->slots[slot];
    wh__entry_t e = wh__index(s, slot)[pos];
    wh_sample_meta_t meta;
    const char *src = wh__data(s, slot) + (e.off <= s->slot_bytes ? e.off : 0);
    if (e.off > s->slot_bytes || e.size > s->slot_bytes - e.off ||
        !wh_sample_decode_meta(src, e.size, schema, gen, pos, &meta, err) ||
        meta.total_size != e.size) {
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (wh__ld(&sl->gen) != gen) return wh__gone(gen, err);
        if (err && err->code != WH_E_CORRUPT && err->code != WH_E_SCHEMA)
            wh_err_set(err, WH_E_CORRUPT, "index entry out of bounds");
        return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    }
    if (wh__ld(&sl->gen) != gen) return wh__gone(gen, err);
    void *dst[WH_MAX_FIELDS] = {0};
    if (fn && !fn(ctx, &meta, dst, err)) return false;
    bool ok = true;
    for (int i = 0; i < meta.nfields && ok; i++)
        if (dst[i])
            ok = wh_sample_copy_field(src, schema, &meta, i, dst[i], st->cfg.verify_reads, err);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    /* shrunk during the copy: it read zero pages, whatever the checksum says */
    if (!wh__shm_intact(s, err)) return false;
    if (wh__ld(&sl->gen) != gen) return wh__gone(gen, err);
    if (!ok) return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    if (meta_out) *meta_out = meta;
    return true;
}

/* ---- store-backed views and reader pins ----
 *
 * A view pins its sample's slot for its pid (count of live views); the slot
 * is never recycled while a live pid pins it. Policy: a process's listed
 * views pin at most one slot at a time, so with four slots a single reader
 * never blocks a seal (write, read and its pinned slot leave one free); a
 * GPU copy's views and a held read's pin are outside it, each held only
 * until its copy completes; several readers
 * pinning two different old generations can delay seals until they drop
 * those views, and the seal reports the pid it waits for. */

/* Serialises this process's pin checks (one slot per process) and its
 * table of live views; held across a fork (wh__fork_prepare). */
static pthread_mutex_t wh__pin_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    wh_buf_t buf;
    wh__map_t *map;
    int slot;
    uint64_t gen;
    /* in wh__held, so a forked child pins it; not a GPU copy's view, which
     * only the parent's loader threads ever use */
    bool listed;
} wh__view_t;

/* This process's live views per (segment, area, generation): what a forked
 * child pins for itself. Guarded by wh__pin_mu; each entry's views hold
 * references to map, so map stays valid while it is listed. */
typedef struct {
    wh__map_t *map;
    int slot;
    uint64_t gen;
    uint32_t views;
} wh__held_t;
static wh__held_t *wh__held;
static size_t wh__nheld, wh__held_cap;

/* Counts one more live view (pin_mu held); false on OOM. */
static bool wh__held_add(wh__map_t *map, int slot, uint64_t gen) {
    for (size_t i = 0; i < wh__nheld; i++)
        if (wh__held[i].map == map && wh__held[i].slot == slot && wh__held[i].gen == gen) {
            wh__held[i].views++;
            return true;
        }
    if (wh__nheld == wh__held_cap) {
        size_t cap = wh__held_cap ? 2 * wh__held_cap : 8;
        wh__held_t *p = realloc(wh__held, cap * sizeof *p);
        if (!p) return false;
        wh__held = p;
        wh__held_cap = cap;
    }
    wh__held[wh__nheld++] = (wh__held_t){map, slot, gen, 1};
    return true;
}

/* One view fewer (pin_mu held). */
static void wh__held_drop(wh__map_t *map, int slot, uint64_t gen) {
    for (size_t i = 0; i < wh__nheld; i++)
        if (wh__held[i].map == map && wh__held[i].slot == slot && wh__held[i].gen == gen) {
            if (--wh__held[i].views == 0) wh__held[i] = wh__held[--wh__nheld];
            return;
        }
}

/* Generation of another area of map this process holds listed views of, or
 * 0 (pin_mu held). Only those count: a GPU copy's pins and another thread's
 * pin for the length of one read are not the caller's to drop. */
static uint64_t wh__held_elsewhere(const wh__map_t *map, int slot) {
    for (size_t i = 0; i < wh__nheld; i++)
        if (wh__held[i].map == map && wh__held[i].slot != slot) return wh__held[i].gen;
    return 0;
}

/* Drops pins of reader processes that no longer exist and recounts the
 * rest (a reader killed inside wh__shm_pin_add may have left npinners short).
 * Slot lock held. */
void wh__shm_prune_pins(wh__slot_t *sl) {
    uint32_t n = 0;
    for (int i = 0; i < WH__MAX_PINNERS; i++) {
        if (sl->pins[i].pid && !wh__pid_alive(sl->pins[i].pid)) {
            __atomic_store_n(&sl->pins[i].count, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&sl->pins[i].pid, 0, __ATOMIC_RELAXED);
        }
        n += sl->pins[i].pid != 0;
    }
    sl->npinners = n;
}

/* Adds n pins of pid to slot (slot lock held). */
static bool wh__shm_pin_add(wh__slot_t *sl, pid_t pid, uint32_t n, wh_err_t *err) {
    int free_i = -1;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < WH__MAX_PINNERS; i++) {
            if (sl->pins[i].pid == pid) {
                __atomic_store_n(&sl->pins[i].count, sl->pins[i].count + n, __ATOMIC_RELAXED);
                return true;
            }
            if (!sl->pins[i].pid && free_i < 0) free_i = i;
        }
        if (free_i >= 0) break;
        wh__shm_prune_pins(sl);
    }
    if (free_i < 0)
        return wh_err_set(err, WH_E_PINNED,
                          "%d reader processes already hold views of this "
                          "generation; read copies instead",
                          WH__MAX_PINNERS);
    __atomic_store_n(&sl->pins[free_i].count, n, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->pins[free_i].pid, pid, __ATOMIC_RELAXED);
    sl->npinners++;
    return true;
}

static void wh__pin_drop(wh__hdr_t *h, int slot, uint64_t gen, pid_t pid) {
    wh__slot_t *sl = &h->slots[slot];
    if (!wh__shm_lock(&sl->lock, WH__PIN_LOCK_WAIT_S, NULL)) return;
    for (int i = 0; i < WH__MAX_PINNERS && wh__ld(&sl->gen) == gen; i++) {
        if (sl->pins[i].pid != pid) continue;
        uint32_t n = sl->pins[i].count ? sl->pins[i].count - 1 : 0;
        __atomic_store_n(&sl->pins[i].count, n, __ATOMIC_RELAXED);
        if (!n) {
            __atomic_store_n(&sl->pins[i].pid, 0, __ATOMIC_RELAXED);
            if (sl->npinners) sl->npinners--;
        }
        break;
    }
    wh__shm_unlock(&sl->lock);
}

/* The view's release (its last DLPack reference): from any thread, no GIL.
 * It drops a pin of the process it runs in: a forked child pinned the views
 * it inherited for itself (wh__fork_child) and leaves the parent's pins
 * alone. */
static void wh__view_release(wh_buf_t *b) {
    wh__view_t *v = b->owner;
    wh_guard_ensure(); /* dropping the pin writes the segment, also at exit */
    pthread_mutex_lock(&wh__pin_mu);
    wh__pin_drop(v->map->rw, v->slot, v->gen, getpid());
    if (v->listed) wh__held_drop(v->map, v->slot, v->gen);
    pthread_mutex_unlock(&wh__pin_mu);
    wh__shm_map_unref(v->map);
    free(v);
}

/* ---- fork: a child pins what it inherits ----
 * pthread_atfork handlers, so they run inside fork() itself, after the
 * interpreter's own fork hooks, where no other thread can take the GIL and
 * block on wh__pin_mu while holding it (a pin_mu holder never needs the
 * GIL). The parent keeps wh__pin_mu from prepare until the child has taken
 * its pins (it says so on a pipe, or the pipe closes: the child died or fork
 * failed), so no view of the parent is released meanwhile and every area
 * the child's inherited views show still holds their generation. vfork
 * (subprocess's usual way) runs no handlers: such a child execs and shows
 * no views. */
#define WH__FORK_WAIT_MS 10000
static int wh__fork_pipe[2] = {-1, -1};
static pthread_once_t wh__fork_once = PTHREAD_ONCE_INIT;

static void wh__fork_prepare(void) {
    pthread_mutex_lock(&wh__pin_mu);
    if (wh__nheld && pipe2(wh__fork_pipe, O_CLOEXEC) != 0)
        wh__fork_pipe[0] = wh__fork_pipe[1] = -1; /* no pipe: the parent waits for nobody */
}

static void wh__fork_parent(void) {
    if (wh__fork_pipe[1] >= 0) {
        close(wh__fork_pipe[1]);
        struct pollfd p = {wh__fork_pipe[0], POLLIN, 0};
        uint64_t deadline = wh_now_mono_ns() + (uint64_t)WH__FORK_WAIT_MS * 1000000u;
        for (;;) { /* a byte or EOF ends it; a signal does not */
            uint64_t now = wh_now_mono_ns();
            if (now >= deadline) break;
            int r = poll(&p, 1, (int)((deadline - now) / 1000000u) + 1);
            if (r > 0 || (r < 0 && errno != EINTR)) break;
        }
        close(wh__fork_pipe[0]);
        wh__fork_pipe[0] = wh__fork_pipe[1] = -1;
    }
    pthread_mutex_unlock(&wh__pin_mu);
}

static void wh__fork_child(void) {
    pid_t me = getpid();
    if (wh__fork_pipe[0] >= 0) close(wh__fork_pipe[0]);
    for (size_t i = 0; i < wh__nheld; i++) {
        wh__held_t *e = &wh__held[i];
        wh__slot_t *sl = &((wh__hdr_t *)e->map->rw)->slots[e->slot];
        wh_err_t err = {0};
        bool ok = wh__shm_lock(&sl->lock, WH__PIN_LOCK_WAIT_S, &err);
        if (ok) {
            ok = wh__ld(&sl->gen) == e->gen
                     ? wh__shm_pin_add(sl, me, e->views, &err)
                     : wh_err_set(&err, WH_E_GONE, "its area was reused before the child ran");
            wh__shm_unlock(&sl->lock);
        }
        if (!ok) { /* the child's views of e->gen may show other bytes: say so */
            char msg[WH_ERR_LEN + 200]; /* no stdio: a parent thread may hold its locks */
            int n = snprintf(msg, sizeof msg,
                             "wirehead_torch: forked process %d could not "
                             "pin generation %llu for the %u store-backed views it inherited "
                             "(%s); do not use them\n",
                             (int)me, (unsigned long long)e->gen, e->views, err.message);
            if (n > 0 && write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0)
                n = 0; /* nowhere to say it */
        }
    }
    if (wh__fork_pipe[1] >= 0) {
        char one = 1;
        ssize_t n;
        do n = write(wh__fork_pipe[1], &one, 1);
        while (n < 0 && errno == EINTR);
        close(wh__fork_pipe[1]);
    }
    wh__fork_pipe[0] = wh__fork_pipe[1] = -1;
    pthread_mutex_unlock(&wh__pin_mu); /* locked by this thread in prepare */
}

static void wh__fork_register(void) {
    pthread_atfork(wh__fork_prepare, wh__fork_parent, wh__fork_child);
}

/* Attaches the handle and finds the area of sealed generation gen. */
static bool wh__sealed_area(wh__shm_t *s, uint64_t gen, int *slot, wh_err_t *err) {
    return wh__shm_ready(s, NULL, 0, err) && wh__shm_intact(s, err) &&
           wh__sealed_slot(s, gen, slot, err);
}

/* A copy holding its generation: a pin of this process keeps the area
 * from reuse for the length of the copy, so a slow reader cannot lose the
 * race with reclamation. Outside the one-generation policy of views: it
 * lasts one copy, so a seal it blocks waits only that long. */
bool wh__shm_read_held(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                       wh_sample_meta_t *meta, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    int slot;
    if (!wh__sealed_area(s, gen, &slot, err)) return false;
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    pthread_once(&wh__fork_once, wh__fork_register); /* wh__pin_mu across a fork */
    pthread_mutex_lock(&wh__pin_mu);
    bool ok = wh__shm_lock(&sl->lock, st->cfg.lease_s, err);
    if (ok) {
        ok = wh__ld(&sl->gen) == gen ? wh__shm_pin_add(sl, s->pid, 1, err) : wh__gone(gen, err);
        wh__shm_unlock(&sl->lock);
    }
    pthread_mutex_unlock(&wh__pin_mu);
    if (!ok) return false;
    ok = wh__read_attached(st, gen, pos, fn, ctx, meta, err); /* h stays mapped */
    pthread_mutex_lock(&wh__pin_mu);
    wh__pin_drop(h, slot, gen, s->pid);
    pthread_mutex_unlock(&wh__pin_mu);
    return ok;
}

bool wh__shm_view(wh_store_t *st, uint64_t gen, uint32_t pos, const uint64_t *known, wh_buf_t **out,
                  wh_sample_meta_t *meta_out, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    int slot;
    if (!wh__sealed_area(s, gen, &slot, err)) return false;
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    wh__view_t *v = calloc(1, sizeof *v);
    if (!v) return wh_err_set(err, WH_E_SYS, "out of memory");
    pthread_once(&wh__fork_once, wh__fork_register);
    pthread_mutex_lock(&wh__pin_mu);
    bool locked = wh__shm_lock(&sl->lock, st->cfg.lease_s, err), ok = locked;
    if (ok && wh__ld(&sl->gen) != gen) ok = wh__gone(gen, err);
    uint64_t other = ok && !s->dma_views ? wh__held_elsewhere(s->map, slot) : 0;
    if (ok && other)
        ok = wh_err_set(err, WH_E_PINNED,
                        "this process (pid %d) still holds views of generation "
                        "%llu; a process pins one generation at a time, so drop those views "
                        "(del the tensors) before viewing generation %llu, or read a copy",
                        (int)s->pid, (unsigned long long)other, (unsigned long long)gen);
    if (ok) ok = wh__shm_pin_add(sl, s->pid, 1, err);
    if (locked) wh__shm_unlock(&sl->lock);
    v->listed = !s->dma_views;
    if (ok && v->listed && !wh__held_add(s->map, slot, gen)) {
        wh__pin_drop(h, slot, gen, s->pid);
        ok = wh_err_set(err, WH_E_SYS, "out of memory");
    }
    pthread_mutex_unlock(&wh__pin_mu);
    if (!ok) {
        free(v);
        return false;
    }
    /* Pinned: the slot keeps gen until the pin is dropped. Validate the entry
     * and the checksums once, here, for the life of this view. */
    wh__entry_t e = wh__index(s, slot)[pos];
    wh_sample_meta_t meta;
    const char *src = s->ro + s->data_off + (size_t)slot * s->slot_bytes;
    if (e.off > s->slot_bytes || e.size > s->slot_bytes - e.off) {
        ok = wh_err_set(err, WH_E_CORRUPT, "index entry out of bounds");
    } else {
        src += e.off;
        ok = wh_sample_decode_meta(src, e.size, &st->cfg.schema, gen, pos, &meta, err) &&
             (meta.total_size == e.size ||
              wh_err_set(err, WH_E_CORRUPT, "sample size differs from its index entry"));
        /* the GPU path checks a sealed sample's bytes once per process: its
         * copies are DMA, and hashing every byte again each epoch would make
         * the host, not the link, the bound */
        bool memo = ok && s->dma_views && wh__memo_has(s->map, slot, gen, pos);
        for (int i = 0; ok && !memo && st->cfg.verify_reads && i < meta.nfields; i++)
            if (!(known && known[i] && known[i] == meta.f[i].checksum))
                ok = wh_sample_verify(&st->cfg.schema, &meta, i, src + meta.f[i].offset, err);
        if (ok && !memo && s->dma_views && st->cfg.verify_reads)
            wh__memo_set(s->map, slot, gen, pos, s->swap_cap);
    }
    if (!ok) {
        pthread_mutex_lock(&wh__pin_mu);
        wh__pin_drop(h, slot, gen, s->pid);
        if (v->listed) wh__held_drop(s->map, slot, gen);
        pthread_mutex_unlock(&wh__pin_mu);
        free(v);
        return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    }
    __atomic_fetch_add(&s->map->refs, 1, __ATOMIC_RELAXED);
    v->map = s->map;
    v->slot = slot;
    v->gen = gen;
    v->buf.refs = 1;
    v->buf.data = (void *)src;
    v->buf.size = e.size;
    v->buf.device_type = 1; /* kDLCPU */
    v->buf.release = wh__view_release;
    v->buf.owner = v;
    *out = &v->buf;
    if (meta_out) *meta_out = meta;
    return true;
}

void wh__shm_set_dma_views(wh_store_t *st, bool on) { ((wh__shm_t *)st)->dma_views = on; }

void *wh__shm_view_map(const wh_buf_t *view, const void **base, size_t *len) {
    if (!view || view->release != wh__view_release) return NULL;
    wh__map_t *m = ((const wh__view_t *)view->owner)->map;
    __atomic_fetch_add(&m->refs, 1, __ATOMIC_RELAXED);
    *base = m->ro;
    *len = m->len;
    return m;
}

void wh__shm_map_release(void *map) { wh__shm_map_unref(map); }

bool wh__shm_view_intact(const wh_buf_t *view, wh_err_t *err) {
    if (!view || view->release != wh__view_release) return true;
    const wh__map_t *m = ((const wh__view_t *)view->owner)->map;
    long long size;
    return !wh_guard_cut(m->ro, &size) || wh__shm_cut(err, m->name, m->segment, size, m->len);
}

bool wh__shm_map_in_use(void *map) {
    return __atomic_load_n(&((wh__map_t *)map)->refs, __ATOMIC_ACQUIRE) > 1;
}
