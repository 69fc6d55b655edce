/* The DataLoader workers' batch ring (wh_ring.h): shared maps of the ring
 * files and their control words. */
#define _GNU_SOURCE
#include "wh_ring.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* XXH3 with the widest SIMD the CPU has, chosen at run time */
#endif

#include "wh_fault.h"
#include "wh_guard.h"
#include "wh_shmfile.h"

bool wh_map_file(wh_map_t *m, const char *path, size_t size, int how, bool populate, bool hugepage,
                 bool *busy, wh_err_t *err) {
    m->base = NULL;
    m->size = 0;
    m->fd = -1;
    if (busy) *busy = false;
    if (strlen(path) >= sizeof m->path)
        return wh_err_set(err, WH_E_INVALID, "ring file path too long: %s", path);
    snprintf(m->path, sizeof m->path, "%s", path);
    if (size == 0) return wh_err_set(err, WH_E_INVALID, "ring file %s: size 0", path);
    int fd;
    if (how == WH_MAP_CREATE) {
        fd = wh_shmfile_create(path, size, err);
    } else if (how == WH_MAP_OPEN) {
        fd = wh_shmfile_open(path, size, err);
    } else {
        /* made empty, then locked, then reserved: whoever opens it meanwhile
         * finds it locked, or empty and free to reserve under its own lock */
        fd = wh_shmfile_create(path, 0, err);
        if (fd == -EEXIST) fd = wh_shmfile_open(path, 0, err);
    }
    if (fd < 0) return false;
    if (how == WH_MAP_REGION) {
        uint64_t have = 0;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK && busy) *busy = true;
            return wh_err_set(err, WH_E_SYS, "ring file %s: %s", path,
                              e == EWOULDBLOCK ? "held by another live process" : strerror(e));
        }
        if (!wh_shmfile_check(fd, path, 0, &have, err) ||
            (have == 0 && !wh_shmfile_reserve(fd, path, size, err))) {
            close(fd);
            return false;
        }
    }
    if (!wh_shmfile_check(fd, path, size, NULL, err)) {
        close(fd);
        return false;
    }
    void *p = wh_guard_mmap(size, PROT_READ | PROT_WRITE,
                            MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return wh_err_set(err, WH_E_SYS, "ring file %s: mmap of %zu bytes: %s", path, size,
                          strerror(e));
    }
    if (hugepage) madvise(p, size, MADV_HUGEPAGE); /* advice only: shmem huge pages may be off */
    m->base = p;
    m->size = size;
    m->fd = fd;
    return true;
}

void wh_map_unlock(wh_map_t *m) {
    if (m->fd >= 0) flock(m->fd, LOCK_UN);
}

bool wh_map_intact(const wh_map_t *m, wh_err_t *err) {
    wh_guard_ensure(); /* callers touch the map next */
    if (!m->base) return wh_err_set(err, WH_E_INVALID, "ring file %s: not mapped", m->path);
    uint64_t have = 0;
    if (!wh_shmfile_check(m->fd, m->path, m->size, &have, err)) return false;
    /* shrunk under a touch, even if grown back: the map shows zero pages */
    if (wh_guard_shrunk(m->base)) /* an OSError naming the file, as a short file is */
        return wh_err_set(err, WH_E_INVALID,
                          "%s was truncated under this process (%llu bytes now, %zu mapped)",
                          m->path, (unsigned long long)have, m->size);
    return true;
}

bool wh_map_hash(const wh_map_t *m, size_t off, size_t n, uint64_t *out, wh_err_t *err) {
    if (!wh_map_intact(m, err)) return false;
    if (off > m->size || n > m->size - off)
        return wh_err_set(err, WH_E_INVALID, "ring file %s: bytes %zu..%zu to check, %zu mapped",
                          m->path, off, off + n, m->size);
    *out = XXH3_64bits((const char *)m->base + off, n);
    return true;
}

void wh_map_close(wh_map_t *m) {
    wh_guard_munmap(m->base, m->size);
    if (m->fd >= 0) close(m->fd);
    m->base = NULL;
    m->size = 0;
    m->fd = -1;
}

static int64_t *wh__word(const wh_map_t *m, size_t i) { return (int64_t *)m->base + i; }

int64_t wh_word_load(const wh_map_t *m, size_t i) {
    return __atomic_load_n(wh__word(m, i), __ATOMIC_SEQ_CST);
}

void wh_word_store(const wh_map_t *m, size_t i, int64_t v) {
    __atomic_store_n(wh__word(m, i), v, __ATOMIC_SEQ_CST);
}

bool wh_word_cas(const wh_map_t *m, size_t i, int64_t expect, int64_t desired) {
    return __atomic_compare_exchange_n(wh__word(m, i), &expect, desired, false, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int64_t wh_word_add(const wh_map_t *m, size_t i, int64_t d) {
    return __atomic_add_fetch(wh__word(m, i), d, __ATOMIC_SEQ_CST);
}

/* ---- the ring protocol ---- */

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "wh_batch.h"

/* A slot file's mapping at one version; the last reference unmaps it. */
typedef struct {
    wh_buf_t buf; /* first member: the release callback casts back */
    wh_map_t m;
    int64_t ver;
} wh__smap_t;

struct wh_ring {
    uint64_t refs; /* the owner's + one per batch out */
    pthread_mutex_t mu;
    wh_map_t words;
    uint32_t nslots;
    int64_t self;
    char label[32];
    wh__smap_t **maps; /* per slot, the version last mapped here */
};

/* A claimed slot, handed back when its last reference goes. */
typedef struct {
    wh_buf_t buf;
    wh_ring_t *r;
    wh__smap_t *map;
    int j;
    int64_t seq, owner;
} wh__held_t;

static void wh__smap_release(wh_buf_t *b) {
    wh__smap_t *s = (wh__smap_t *)b;
    wh_map_close(&s->m);
    free(s);
}

static void wh__ring_unref(wh_ring_t *r) {
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    for (uint32_t j = 0; r->maps && j < r->nslots; j++)
        if (r->maps[j]) wh_buf_unref(&r->maps[j]->buf);
    free(r->maps);
    wh_map_close(&r->words);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The control file still whole: before any word is touched. */
static bool wh__words_ok(wh_ring_t *r, wh_err_t *err) {
    if (wh_map_intact(&r->words, err)) return true;
    return wh_err_prefix(err, "wirehead ring control file");
}

static int64_t wh__w(wh_ring_t *r, int j, int k) {
    return wh_word_load(&r->words, (size_t)j * WH_RING_WORDS + (size_t)k);
}

static void wh__slot_path(const wh_ring_t *r, int j, int64_t ver, char *out, size_t cap) {
    snprintf(out, cap, "%s.s%d.v%lld", r->words.path, j, (long long)ver);
}

static wh__smap_t *wh__smap_new(const char *path, size_t size, int how, wh_err_t *err) {
    wh__smap_t *s = calloc(1, sizeof *s);
    if (!s) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    /* populated up front, once per slot and process: no faults per batch */
    if (!wh_map_file(&s->m, path, size, how, true, how == WH_MAP_CREATE, NULL, err)) {
        free(s);
        return NULL;
    }
    s->buf.refs = 1;
    s->buf.data = s->m.base;
    s->buf.size = s->m.size;
    s->buf.device_type = 1;
    s->buf.release = wh__smap_release;
    s->buf.owner = s;
    return s;
}

/* Slot j mapped at the version its words name (mapped anew when it grew);
 * mu held, the words checked. */
static wh__smap_t *wh__slot(wh_ring_t *r, int j, wh_err_t *err) {
    int64_t ver = wh__w(r, j, WH_RING_VER), cap = wh__w(r, j, WH_RING_CAP);
    wh__smap_t *have = r->maps[j];
    if (have && have->ver == ver) return have;
    if (cap <= 0)
        return wh_err_set(err, WH_E_SYS,
                          "wirehead ring control file %s: slot %d has capacity %lld: the file "
                          "was damaged",
                          r->words.path, j, (long long)cap),
               NULL;
    char path[WH_MAP_PATH + 48];
    wh__slot_path(r, j, ver, path, sizeof path);
    wh__smap_t *s = wh__smap_new(path, (size_t)cap, WH_MAP_OPEN, err);
    if (!s) return wh_err_prefix(err, "wirehead ring slot"), NULL;
    s->ver = ver;
    if (have) wh_buf_unref(&have->buf);
    r->maps[j] = s;
    return s;
}

wh_ring_t *wh_ring_open(const char *path, const char *label, uint32_t nslots, bool worker,
                        int64_t main_pid, bool *busy, wh_err_t *err) {
    if (busy) *busy = false;
    if (nslots < 1 || nslots > WH_RING_SLOTS_MAX)
        return wh_err_set(err, WH_E_INVALID, "ring_slots must be 1..%u, got %u", WH_RING_SLOTS_MAX,
                          nslots),
               NULL;
    wh_ring_t *r = calloc(1, sizeof *r);
    if (!r || !(r->maps = calloc(nslots, sizeof *r->maps))) {
        free(r);
        return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    }
    r->refs = 1;
    r->nslots = nslots;
    r->self = (int64_t)getpid();
    snprintf(r->label, sizeof r->label, "%s", label ? label : "?");
    pthread_mutex_init(&r->mu, NULL);
    /* a worker holds the region's lock for as long as it keeps the map */
    if (!wh_map_file(&r->words, path, (size_t)nslots * WH_RING_WORDS * 8,
                     worker ? WH_MAP_REGION : WH_MAP_OPEN, false, false, busy, err)) {
        wh_err_prefix(err, "wirehead ring control file");
        wh__ring_unref(r);
        return NULL;
    }
    if (worker) {
        if (!wh__words_ok(r, err)) {
            wh__ring_unref(r);
            return NULL;
        }
        for (uint32_t j = 0; j < nslots; j++) {
            /* not held by the main process: a dead or finished worker's */
            size_t i = (size_t)j * WH_RING_WORDS + WH_RING_OWNER;
            int64_t held = wh_word_load(&r->words, i);
            if (held != 0 && held != main_pid) wh_word_cas(&r->words, i, held, 0);
        }
    }
    return r;
}

void wh_ring_close(wh_ring_t *r) {
    if (r) wh__ring_unref(r);
}

void wh_ring_unlock(wh_ring_t *r) { wh_map_unlock(&r->words); }

/* Removes path if it is a file of this user's (left by a worker that died
 * while growing the slot); anything else stays, and making the file there
 * is then refused naming it. */
static void wh__unlink_ours(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) unlink(path);
}

/* Slot j's file replaced by a larger one, made first; mu held. */
static bool wh__grow(wh_ring_t *r, int j, uint64_t nbytes, wh_err_t *err) {
    long page = sysconf(_SC_PAGESIZE);
    uint64_t pg = page > 0 ? (uint64_t)page : 4096, cap;
    if (!wh_add_ok(nbytes, pg - 1, &cap) || cap > SIZE_MAX)
        return wh_err_set(err, WH_E_INVALID, "wirehead ring slot: %llu bytes is too large",
                          (unsigned long long)nbytes);
    cap -= cap % pg;
    int64_t ver = wh__w(r, j, WH_RING_VER);
    if (ver < 0 || ver == INT64_MAX) /* read from shared memory: checked before the +1 */
        return wh_err_set(err, WH_E_INVALID,
                          "wirehead ring control file %s: slot %d has version %lld: the file "
                          "was damaged",
                          r->words.path, j, (long long)ver);
    char path[WH_MAP_PATH + 48], old[WH_MAP_PATH + 48];
    wh__slot_path(r, j, ver + 1, path, sizeof path);
    wh__slot_path(r, j, ver, old, sizeof old);
    wh__unlink_ours(path);
    wh__smap_t *s = wh__smap_new(path, (size_t)cap, WH_MAP_CREATE, err);
    if (!s) {
        if (err && err->code == WH_E_NOSPACE) {
            char why[WH_ERR_LEN];
            snprintf(why, sizeof why, "%s", err->message);
            return wh_err_set(err, WH_E_NOSPACE,
                              "wirehead ring slot %s; free space there, or lower ring_slots or "
                              "the batch size",
                              why);
        }
        return wh_err_prefix(err, "wirehead ring slot");
    }
    s->ver = ver + 1;
    unlink(old);
    size_t i = (size_t)j * WH_RING_WORDS;
    wh_word_store(&r->words, i + WH_RING_CAP, (int64_t)cap);
    wh_word_store(&r->words, i + WH_RING_VER, ver + 1);
    if (r->maps[j]) wh_buf_unref(&r->maps[j]->buf);
    r->maps[j] = s;
    return true;
}

/* One try at a free slot; mu held. *slot -1 when every slot is held. */
static bool wh__take(wh_ring_t *r, uint64_t nbytes, int *slot, void **data, wh_err_t *err) {
    *slot = -1;
    if (!wh__words_ok(r, err)) return false;
    int free_j = -1, fit_j = -1;
    for (uint32_t j = 0; j < r->nslots && fit_j < 0; j++) {
        if (wh__w(r, (int)j, WH_RING_OWNER) != 0) continue;
        if (free_j < 0) free_j = (int)j;
        if ((uint64_t)wh__w(r, (int)j, WH_RING_CAP) >= nbytes && wh__w(r, (int)j, WH_RING_CAP) > 0)
            fit_j = (int)j;
    }
    /* only this process takes free slots of its region, so under mu a free
     * slot stays free */
    int j = fit_j >= 0 ? fit_j : free_j;
    if (j < 0) return true;
    size_t i = (size_t)j * WH_RING_WORDS;
    wh_word_add(&r->words, i + WH_RING_SEQ, 1);
    wh_word_store(&r->words, i + WH_RING_OWNER, r->self);
    wh__smap_t *s = NULL;
    if ((fit_j >= 0 || wh__grow(r, j, nbytes, err)) && (s = wh__slot(r, j, err)) &&
        wh_map_intact(&s->m, err)) {
        *slot = j;
        *data = s->m.base;
        return true;
    }
    if (wh_map_intact(&r->words, NULL)) wh_word_store(&r->words, i + WH_RING_OWNER, 0);
    return false;
}

bool wh_ring_acquire(wh_ring_t *r, uint64_t nbytes, double wait_s, int *slot, void **data,
                     wh_err_t *err) {
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)(wait_s > 0 ? wait_s * 1e9 : 0);
    long delay_us = 50;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool ok = wh__take(r, nbytes, slot, data, err);
        pthread_mutex_unlock(&r->mu);
        if (!ok || *slot >= 0 || wh_now_mono_ns() >= deadline) return ok;
        struct timespec ts = {0, delay_us * 1000L};
        nanosleep(&ts, NULL);
        delay_us = delay_us < 1000 ? delay_us * 2 : 2000;
    }
}

void wh_ring_give_back(wh_ring_t *r, int j) {
    pthread_mutex_lock(&r->mu);
    if (j >= 0 && (uint32_t)j < r->nslots && wh_map_intact(&r->words, NULL))
        wh_word_cas(&r->words, (size_t)j * WH_RING_WORDS + WH_RING_OWNER, r->self, 0);
    pthread_mutex_unlock(&r->mu);
}

static bool wh__slot_ok(const wh_ring_t *r, int j, wh_err_t *err) {
    if (j >= 0 && (uint32_t)j < r->nslots) return true;
    return wh_err_set(err, WH_E_INVALID, "wirehead ring %s: no slot %d of %u", r->words.path, j,
                      r->nslots);
}

bool wh_ring_stamp(wh_ring_t *r, int j, int64_t *ver, int64_t *seq, wh_err_t *err) {
    if (!wh__slot_ok(r, j, err) || !wh__words_ok(r, err)) return false;
    *ver = wh__w(r, j, WH_RING_VER);
    *seq = wh__w(r, j, WH_RING_SEQ);
    return true;
}

bool wh_ring_word(wh_ring_t *r, int j, int k, int64_t *out, wh_err_t *err) {
    if (!wh__slot_ok(r, j, err) || !wh__words_ok(r, err)) return false;
    if (k < 0 || k >= WH_RING_WORDS)
        return wh_err_set(err, WH_E_INVALID, "wirehead ring: no word %d", k);
    *out = wh__w(r, j, k);
    return true;
}

bool wh_ring_hash(wh_ring_t *r, int j, uint64_t off, uint64_t n, uint64_t *out, wh_err_t *err) {
    if (!wh__slot_ok(r, j, err)) return false;
    pthread_mutex_lock(&r->mu);
    wh__smap_t *s = wh__words_ok(r, err) ? wh__slot(r, j, err) : NULL;
    bool ok = s && wh_map_hash(&s->m, off, n, out, err);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static void wh__held_release(wh_buf_t *b) {
    wh__held_t *h = (wh__held_t *)b;
    wh_ring_t *r = h->r;
    /* back to the worker, unless the slot was reclaimed and refilled since,
     * or this is a forked child dropping its copy of the parent's batch (the
     * parent's tensors still use the slot) */
    size_t i = (size_t)h->j * WH_RING_WORDS;
    if ((int64_t)getpid() == r->self && wh_map_intact(&r->words, NULL) &&
        wh_word_load(&r->words, i + WH_RING_SEQ) == h->seq)
        wh_word_cas(&r->words, i + WH_RING_OWNER, h->owner, 0);
    wh_buf_unref(&h->map->buf);
    free(h);
    wh__ring_unref(r);
}

/* The buffer over slot j's first size bytes held by owner; mu held. */
static bool wh__hold(wh_ring_t *r, int j, wh__smap_t *s, int64_t seq, int64_t owner, uint64_t size,
                     wh_buf_t **out, wh_err_t *err) {
    if (size > s->m.size)
        return wh_err_set(err, WH_E_TOOBIG,
                          "wirehead ring: a batch of %llu bytes does not fit its slot file %s "
                          "(%zu bytes)",
                          (unsigned long long)size, s->m.path, s->m.size);
    wh__held_t *h = calloc(1, sizeof *h);
    if (!h) return wh_err_set(err, WH_E_SYS, "out of memory");
    h->buf.refs = 1;
    h->buf.data = s->m.base;
    h->buf.size = (size_t)size;
    h->buf.device_type = 1;
    h->buf.release = wh__held_release;
    h->buf.owner = h;
    h->r = r;
    h->map = s;
    h->j = j;
    h->seq = seq;
    h->owner = owner;
    wh_buf_ref(&s->buf);
    __atomic_fetch_add(&r->refs, 1, __ATOMIC_RELAXED);
    *out = &h->buf;
    return true;
}

/* The hand-over check of many rows is spread over threads: a trainer's
 * main process is one thread, and the node's other cores are usually idle
 * while it takes a batch. Below this many bytes a thread costs more than it
 * saves. */
#define WH__CHECK_PAR_BYTES (8ull << 20)
#define WH__CHECK_THREADS 8

typedef struct {
    const wh_map_t *m;
    const wh_ring_check_t *checks;
    size_t n;
    size_t next; /* atomic: the next row to hash */
    bool bad;    /* atomic: a row failed (stop early) */
    bool failed; /* wh_map_hash failed: err holds why (under mu) */
    pthread_mutex_t mu;
    wh_err_t err;
} wh__rows_t;

static void *wh__rows_run(void *arg) {
    wh__rows_t *c = arg;
    for (;;) {
        size_t k = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
        if (k >= c->n || __atomic_load_n(&c->bad, __ATOMIC_RELAXED)) return NULL;
        uint64_t h = 0;
        wh_err_t e = {0};
        bool hashed = wh_map_hash(c->m, c->checks[k].off, c->checks[k].n, &h, &e);
        if (!hashed) {
            pthread_mutex_lock(&c->mu);
            if (!c->failed) c->err = e;
            c->failed = true;
            pthread_mutex_unlock(&c->mu);
        }
        if (!hashed || h != c->checks[k].hash) __atomic_store_n(&c->bad, true, __ATOMIC_RELAXED);
    }
}

/* Every row's XXH3 against the worker's: true with *same, or false with err
 * (the file could not be checked). */
static bool wh__check_rows(const wh_map_t *m, const wh_ring_check_t *checks, size_t n, bool *same,
                           wh_err_t *err) {
    wh__rows_t c = {.m = m, .checks = checks, .n = n};
    pthread_mutex_init(&c.mu, NULL);
    uint64_t bytes = 0;
    for (size_t k = 0; k < n; k++) bytes += checks[k].n;
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    size_t want = bytes < WH__CHECK_PAR_BYTES || cpus < 2 ? 1 : n < (size_t)cpus ? n : (size_t)cpus;
    if (want > WH__CHECK_THREADS) want = WH__CHECK_THREADS;
    pthread_t th[WH__CHECK_THREADS];
    size_t started = 0;
    if (want > 1) (void)XXH3_64bits(&c, 0); /* XXH3's SIMD choice made here, not in a race */
    for (; started + 1 < want; started++)
        if (pthread_create(&th[started], NULL, wh__rows_run, &c) != 0) break; /* fewer helpers */
    wh__rows_run(&c);
    for (size_t t = 0; t < started; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&c.mu);
    if (c.failed) {
        if (err) *err = c.err;
        return false;
    }
    *same = !c.bad;
    return true;
}

/* ---- the seal ---- */

uint64_t wh_ring_bytes(uint64_t size, size_t n) {
    return WH_ALIGN_UP(size) + 8 * WH_RING_SEAL_WORDS + (uint64_t)n * sizeof(wh_ring_check_t);
}

bool wh_ring_seal(wh_ring_t *r, int j, uint64_t size, const wh_ring_check_t *checks, size_t n,
                  uint64_t *sum, wh_err_t *err) {
    if (!wh__slot_ok(r, j, err)) return false;
    pthread_mutex_lock(&r->mu);
    wh__smap_t *s = wh__words_ok(r, err) ? wh__slot(r, j, err) : NULL;
    bool ok = s && wh_map_intact(&s->m, err);
    uint64_t off = WH_ALIGN_UP(size), need = wh_ring_bytes(size, n);
    if (ok && (size > need || need > s->m.size))
        ok = wh_err_set(err, WH_E_TOOBIG,
                        "wirehead ring: a batch of %llu bytes and its seal do not fit slot file "
                        "%s (%zu bytes)",
                        (unsigned long long)size, s->m.path, s->m.size);
    if (ok) {
        uint64_t hdr[WH_RING_SEAL_WORDS] = {WH_RING_SEAL_MAGIC,
                                            (uint64_t)r->self,
                                            (uint64_t)wh__w(r, j, WH_RING_SEQ),
                                            (uint64_t)wh__w(r, j, WH_RING_VER),
                                            size,
                                            n,
                                            0,
                                            0};
        char *p = (char *)s->m.base + off;
        memcpy(p, hdr, sizeof hdr);
        memcpy(p + sizeof hdr, checks, n * sizeof *checks);
        *sum = XXH3_64bits(p, need - off);
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Slot s holds the seal of the handle (wpid, seq, ver, size, sum, rows):
 * copied out before it is checked, so what was checked is what is used;
 * *copy (the caller frees it) gets the header, then the row table. */
static bool wh__check_seal(const wh__smap_t *s, int64_t wpid, int64_t seq, int64_t ver,
                           uint64_t size, uint64_t sum, size_t rows, uint64_t **copy,
                           wh_err_t *err) {
    *copy = NULL;
    if (!wh_map_intact(&s->m, err)) return false;
    uint64_t off = WH_ALIGN_UP(size);
    const char *why = NULL;
    if (size > s->m.size || off > s->m.size || rows > (s->m.size - off) / sizeof(wh_ring_check_t) ||
        wh_ring_bytes(size, rows) > s->m.size) {
        why = "the slot cannot hold its seal";
    } else {
        size_t n = (size_t)(wh_ring_bytes(size, rows) - off);
        uint64_t *h = *copy = malloc(n);
        if (!h) return wh_err_set(err, WH_E_SYS, "out of memory");
        memcpy(h, (const char *)s->m.base + off, n);
        const wh_ring_check_t *t = (const wh_ring_check_t *)(h + WH_RING_SEAL_WORDS);
        if (XXH3_64bits(h, n) != sum)
            why = "its header or row table fails its XXH3 check";
        else if (h[0] != WH_RING_SEAL_MAGIC || h[1] != (uint64_t)wpid || h[2] != (uint64_t)seq ||
                 h[3] != (uint64_t)ver || h[4] != size || h[5] != rows)
            why = "its header names another fill";
        for (size_t k = 0; !why && k < rows; k++)
            if (t[k].off > size || t[k].n > size - t[k].off)
                why = "its row table reaches past the batch";
    }
    if (!why) return true;
    free(*copy);
    *copy = NULL;
    return wh_err_set(err, WH_E_CORRUPT,
                      "wirehead ring: slot file %s does not hold the batch worker %lld sealed "
                      "(%s); this batch cannot be delivered",
                      s->m.path, (long long)wpid, why);
}

bool wh_ring_claim(wh_ring_t *r, int j, int64_t ver, int64_t seq, int64_t wpid, uint64_t size,
                   uint64_t sum, size_t rows, int check, wh_buf_t **out, wh_err_t *err) {
    *out = NULL;
    if (!wh__slot_ok(r, j, err)) return false;
    pthread_mutex_lock(&r->mu);
    size_t i = (size_t)j * WH_RING_WORDS;
    bool ok = wh__words_ok(r, err);
    /* the owner word changes hands atomically: a worker reclaiming the slot
     * at the same moment either sees it held here or takes it first */
    bool taken = ok && wh__w(r, j, WH_RING_SEQ) == seq && wh__w(r, j, WH_RING_VER) == ver &&
                 wh_word_cas(&r->words, i + WH_RING_OWNER, wpid, r->self);
    /* and still this fill after the CAS: a worker takes a slot by counting
     * its sequence up before it stores its pid, so a slot it took back and
     * took again in between shows here, and stays with it */
    if (taken && (wh__w(r, j, WH_RING_SEQ) != seq || wh__w(r, j, WH_RING_VER) != ver)) {
        wh_word_cas(&r->words, i + WH_RING_OWNER, r->self, wpid);
        taken = false;
    }
    if (ok && !taken) {
        pthread_mutex_unlock(&r->mu);
        return wh_err_set(err, WH_E_GONE,
                          "wirehead ring: slot %d of worker %s was reclaimed or refilled before "
                          "its batch arrived (worker %lld); this batch cannot be delivered",
                          j, r->label, (long long)wpid);
    }
    wh__smap_t *s = ok ? wh__slot(r, j, err) : NULL;
    ok = s != NULL;
    /* the seal the worker wrote after its fill (its rows were checked as
     * they were copied), then the extras, or every row again: garbage in
     * the seal, the extras, or (ROWS) a row is an error naming the file */
    uint64_t *seal = NULL;
    if (ok && check != WH_RING_CHECK_NONE)
        ok = wh__check_seal(s, wpid, seq, ver, size, sum, rows, &seal, err);
    const wh_ring_check_t *table =
        seal ? (const wh_ring_check_t *)(seal + WH_RING_SEAL_WORDS) : NULL;
    bool same = true;
    if (ok && check == WH_RING_CHECK_ROWS)
        ok = wh__check_rows(&s->m, table, rows, &same, err);
    else if (ok && check == WH_RING_CHECK_SLOT && rows)
        ok = wh__check_rows(&s->m, table + rows - 1, 1, &same, err);
    free(seal);
    /* a file cut under the checks read zero pages: that is the error */
    wh_err_t cut = {0};
    if (s && !wh_map_intact(&s->m, &cut)) {
        ok = false;
        if (err) *err = cut;
    }
    if (ok && !same)
        ok = wh_err_set(err, WH_E_CORRUPT,
                        "wirehead ring: slot file %s was changed after worker %lld filled it "
                        "(its bytes fail their XXH3 check); this batch cannot be delivered",
                        s->m.path, (long long)wpid);
    ok = ok && wh__hold(r, j, s, seq, r->self, size, out, err);
    /* refused: back to the worker, which refills it (a damaged control file
     * the worker finds out itself) */
    if (!ok && wh_map_intact(&r->words, NULL))
        wh_word_cas(&r->words, i + WH_RING_OWNER, r->self, 0);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

bool wh_ring_local(wh_ring_t *r, int j, uint64_t size, wh_buf_t **out, wh_err_t *err) {
    *out = NULL;
    if (!wh__slot_ok(r, j, err)) return false;
    pthread_mutex_lock(&r->mu);
    wh__smap_t *s = wh__words_ok(r, err) ? wh__slot(r, j, err) : NULL;
    /* still whole: the tensors are made over it */
    bool ok = s && wh_map_intact(&s->m, err) &&
              wh__hold(r, j, s, wh__w(r, j, WH_RING_SEQ), r->self, size, out, err);
    /* refused: the slot is free again (this region's own slots are not
     * reclaimed by a later open, so one kept here would be lost) */
    if (!ok && wh_map_intact(&r->words, NULL))
        wh_word_cas(&r->words, (size_t)j * WH_RING_WORDS + WH_RING_OWNER, r->self, 0);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

wh_buf_t *wh_ring_slot_map(wh_buf_t *held) {
    if (!held || held->release != wh__held_release) return NULL;
    wh__held_t *h = (wh__held_t *)held;
    wh_buf_ref(&h->map->buf);
    return &h->map->buf;
}

bool wh_ring_held_intact(const wh_buf_t *held, wh_err_t *err) {
    if (!held || held->release != wh__held_release) return true;
    return wh_map_intact(&((const wh__held_t *)held)->map->m, err);
}

/* ---- a worker's fill ---- */

typedef struct {
    wh_ring_t *r;
    double wait_s;
    int slot;
    wh_buf_t *heap;
    bool failed; /* the ring's error, not the read's */
} wh__rfill_t;

static void *wh__rfill_mem(void *ctx, const wh_batch_t *b, wh_err_t *err) {
    wh__rfill_t *c = ctx;
    void *data = NULL;
    /* a retry of the first row lays the batch out again: what it had goes back */
    if (c->slot >= 0) wh_ring_give_back(c->r, c->slot);
    wh_buf_unref(c->heap);
    c->slot = -1;
    c->heap = NULL;
    if (c->r && !wh_ring_acquire(c->r, wh_ring_bytes(b->hsize, wh_batch_checks(b)), c->wait_s,
                                 &c->slot, &data, err)) {
        c->failed = true;
        return NULL;
    }
    if (c->slot >= 0) return data;
    if (!(c->heap = wh_buf_new(b->hsize ? b->hsize : 1)))
        return wh_err_set(err, WH_E_SYS, "out of memory for a %llu-byte batch",
                          (unsigned long long)b->hsize),
               NULL;
    return c->heap->data;
}

/* The slot file still holds every byte before the next row's copy. */
static bool wh__rfill_check(void *ctx, wh_err_t *err) {
    wh__rfill_t *c = ctx;
    if (c->slot < 0) return true;
    pthread_mutex_lock(&c->r->mu);
    wh__smap_t *s = c->r->maps[c->slot];
    bool ok = s && wh_map_intact(&s->m, err);
    pthread_mutex_unlock(&c->r->mu);
    c->failed = !ok;
    return ok;
}

/* A batch of the hand-over of positions that got no slot: its host part
 * and the rows left in the store into one heap buffer, laid out whole. */
static bool wh__rfill_gather(wh__rfill_t *c, wh_batch_t *b, void **data, wh_batch_stats_t *stats,
                             wh_err_t *err) {
    wh_buf_t *whole = wh_buf_new(b->size ? b->size : 1);
    if (!whole)
        return wh_err_set(err, WH_E_SYS, "out of memory for a %llu-byte batch",
                          (unsigned long long)b->size);
    uint64_t rows = 0;
    if (b->n && b->views[0]) wh_fault_cut("heap-gather", b->views[0]->data);
    if (!wh_batch_gather(b, c->heap->data, whole->data, &rows, err)) {
        wh_buf_unref(whole);
        return false;
    }
    stats->host_bytes += rows;
    wh_buf_unref(c->heap);
    c->heap = whole;
    *data = whole->data;
    b->direct = 0;
    b->hsize = b->size;
    return true;
}

/* The filled slot's seal: every wanted row with its stored XXH3 (sums),
 * then the extras hashed as the fill left them. */
static bool wh__rfill_seal(wh_ring_t *r, int j, const wh_batch_t *b, const uint64_t *sums,
                           const char *data, uint64_t *seal, wh_err_t *err) {
    size_t n = wh_batch_checks(b);
    wh_ring_check_t *ck = malloc(n * sizeof *ck), *p = ck;
    if (!ck) return wh_err_set(err, WH_E_SYS, "out of memory");
    for (int f = 0; f < b->nfields; f++) {
        if (!(b->want & ~b->direct & (1u << f))) continue;
        for (uint32_t i = 0; i < b->n; i++, p++) {
            p->off = wh_batch_host_off(b, b->off[f]) + (uint64_t)i * b->meta[f].nbytes;
            p->n = b->meta[f].nbytes;
            p->hash = sums[(size_t)i * WH_MAX_FIELDS + f];
        }
    }
    p->off = wh_batch_host_off(b, b->pad_off);
    p->n = b->hsize - p->off;
    p->hash = XXH3_64bits(data + p->off, p->n);
    bool ok = wh_ring_seal(r, j, b->hsize, ck, n, seal, err);
    free(ck);
    return ok;
}

bool wh_ring_fill(wh_ring_t *r, wh_batch_fill_t *rq, uint64_t gen, double wait_s, int *slot,
                  wh_buf_t **heap, wh_batch_t *b, void **data, uint64_t *seal,
                  wh_batch_stats_t *stats, bool *ring_failed, wh_err_t *err) {
    wh__rfill_t c = {r, wait_s, -1, NULL, false};
    uint64_t *own = NULL, *sums = rq->sums;
    if (!sums && !(sums = own = calloc((size_t)rq->n * WH_MAX_FIELDS, sizeof *sums)))
        return wh_err_set(err, WH_E_SYS, "out of memory");
    rq->sums = sums;
    rq->mem = wh__rfill_mem;
    rq->mem_ctx = &c;
    rq->check = wh__rfill_check;
    *seal = 0;
    /* the hand-over of positions: rows of large fields stay in the store,
     * viewed (and checked once per process) only to fill the rest */
    bool direct = rq->direct_min && r;
    wh_buf_t **views = NULL;
    const char **src = NULL;
    if (direct && (!(views = calloc(rq->n, sizeof *views)) ||
                   !(src = calloc((size_t)rq->n * WH_MAX_FIELDS, sizeof *src)))) {
        free(views);
        free(own);
        rq->sums = NULL;
        return wh_err_set(err, WH_E_SYS, "out of memory");
    }
    if (direct) wh_store_set_dma_views(rq->st, true);
    rq->views = views;
    rq->src = src;
    bool ok = wh_batch_fill(rq, gen, b, data, stats, err);
    if (ok && c.slot >= 0 && !wh__rfill_seal(r, c.slot, b, sums, *data, seal, err))
        ok = !(c.failed = true);
    /* cut while the seal was written: it went to zero pages, not the file */
    if (ok && c.slot >= 0) ok = wh__rfill_check(&c, err);
    /* heap memory crosses pickled: its batch is gathered whole */
    if (ok && c.heap && b->direct) ok = wh__rfill_gather(&c, b, data, stats, err);
    /* no pin crosses the hand-over: the main process takes its own */
    for (uint32_t i = 0; views && i < rq->n; i++) wh_buf_unref(views[i]);
    free(views);
    free(src);
    rq->views = NULL;
    rq->src = NULL;
    b->views = NULL;
    b->src = NULL;
    rq->sums = own ? NULL : sums;
    free(own);
    if (!ok) {
        if (c.slot >= 0) wh_ring_give_back(r, c.slot);
        wh_buf_unref(c.heap);
        c.slot = -1;
        c.heap = NULL;
        *data = NULL;
    }
    *slot = c.slot;
    *heap = c.heap;
    *ring_failed = c.failed;
    return ok;
}
