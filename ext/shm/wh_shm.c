/* Embedded backend: four generation areas (slots) in one POSIX
 * shared-memory segment. Each slot records the generation it holds; a seal
 * picks the next write slot among those holding neither the write nor the
 * read generation, and skips any a reader still pins (store-backed views).
 *
 * Concurrency: writers reserve bytes and commit positions under the slot's
 * robust mutex (the commit point is the store of count, after the index
 * entry); readers take no lock: they check the slot's generation before and
 * after copying (a seqlock) and report WH_E_GONE if it changed. A slot is
 * recycled only when no live writer still has a reservation in it and no
 * live reader pins it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "wh_backend.h"
#include "wh_fault.h"
#include "wh_guard.h"
#include "wh_shmfile.h"

#define WH__SHM_MAGIC 0x324d485344414857ull    /* "WHADSHM2": 4 slots, reader pins */
#define WH__SHM_MAGIC_V1 0x314d485344414857ull /* "WHADSHM1": 3 slots, older builds */
#define WH__SLOTS 4
#define WH__MAX_PINNERS 64 /* reader processes pinning one slot at a time */
#define WH__MAX_WRITERS 256
#define WH__HIST 16
#define WH__OPEN_WAIT_MS 5000

#define WH__MAX_HOLES 64

/* A lock in the segment: the holder's pid, 0 when free. Not a pthread
 * mutex: glibc aborts the process on some garbage in a robust mutex
 * (found by fuzz_segment), and a segment's bytes may be hostile. */
typedef struct {
    int32_t owner;    /* atomic */
    uint32_t waiters; /* atomic: sleepers to wake on release */
} wh__lock_t;

typedef struct {
    int32_t pid; /* 0: free entry */
    uint32_t pad;
    uint64_t token;     /* this put's, so a pruned entry is never taken for ours */
    uint64_t off, size; /* the bytes this put reserved */
} wh__writer_t;

typedef struct {
    uint64_t off, size;
} wh__hole_t;

/* One reader process's pins on a slot: live views of its samples. */
typedef struct {
    int32_t pid; /* 0: free entry */
    uint32_t count;
} wh__pin_t;

typedef struct {
    wh__lock_t lock;
    uint64_t gen;   /* atomic: generation this slot holds, 0 if none */
    uint64_t used;  /* bytes reserved */
    uint32_t count; /* atomic: committed positions */
    uint32_t nwriters;
    uint32_t nholes;
    wh__writer_t writers[WH__MAX_WRITERS];
    /* bytes reserved by puts that died or failed, reused by later puts so a
     * dead generator cannot use up a tight budget */
    wh__hole_t holes[WH__MAX_HOLES];
    uint32_t npinners;
    uint32_t pad;
    wh__pin_t pins[WH__MAX_PINNERS];
} wh__slot_t;

typedef struct {
    uint64_t off, size;
} wh__entry_t;

/* A reader handle's heartbeat; token 0: a free entry. Read by `status`
 * only: a torn or forged entry shows wrong figures, never more. */
typedef struct {
    uint64_t token; /* atomic: claimed by compare-and-swap */
    int64_t pid;
    uint64_t gen, reads, gen_reads, start_ns, beat_ns;
} wh__beat_t;

#define WH__MAX_READERS 128

typedef struct {
    uint64_t magic; /* written last at creation (release) */
    uint32_t format_version;
    uint32_t swap_cap;
    uint64_t hdr_size; /* sizeof(wh__hdr_t) of the creating build */
    uint64_t pidns;    /* inode of the creator's PID namespace (0: unknown) */
    uint64_t schema_hash;
    uint32_t nfields;
    uint32_t pad0;
    char names[WH_MAX_FIELDS][WH_MAX_NAME];
    uint64_t slot_bytes;  /* data bytes per generation area */
    uint64_t total_bytes; /* whole segment */
    uint64_t index_off, data_off;
    int64_t creator_pid;
    uint64_t created_ns;

    wh__lock_t lock;                      /* lease, seal, history */
    uint64_t read_gen;                    /* atomic */
    uint64_t write_gen;                   /* atomic */
    uint64_t generated, discarded, seals; /* atomic */
    int64_t leader_pid;
    uint64_t leader_token;
    uint64_t lease_expiry_ns;
    uint64_t lease_ns; /* the holder's LEASE_SECONDS: bounds how far ahead its expiry may be */
    uint32_t hist_n, hist_next;
    struct {
        uint64_t generation, time_ns, generated, discarded, seal_ns;
    } hist[WH__HIST];
    wh__slot_t slots[WH__SLOTS];
    wh__beat_t readers[WH__MAX_READERS];
    /* a node-local copy's source (wh_store_config_t), set at creation:
     * "" in a plain store */
    char origin_id[WH_ORIGIN_ID_LEN];
    char origin_name[WH_ORIGIN_NAME_LEN];
    uint64_t last_put_ns; /* atomic: CLOCK_REALTIME of the newest put, accepted or not */
} wh__hdr_t;

/* The segment's mappings, shared by the handle and every live view, so a
 * view outlives the handle that made it. */
typedef struct wh__map {
    uint64_t refs;  /* atomic */
    void *rw;       /* the store's own read-write mapping */
    const void *ro; /* the same segment mapped read-only: views point here */
    size_t len;
    /* the segment's file: handles of one process on one segment share one
     * map (one mapping to register with a GPU runtime, not one per handle) */
    dev_t dev;
    ino_t ino;
    struct wh__map *next;
    /* the GPU path's positions verified in this process, per area and for
     * the generation it held then (docs/gpu.md, "Checks") */
    pthread_mutex_t memo_mu;
    uint64_t memo_gen[WH__SLOTS];
    uint8_t *memo[WH__SLOTS];
} wh__map_t;

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

typedef struct {
    wh_store_t base;
    char shm_name[256];
    wh__hdr_t *hdr;
    const char *ro; /* read-only mapping of the segment (views) */
    wh__map_t *map;
    size_t map_len;
    uint64_t token;
    uint64_t puts;
    pid_t pid;
    int fd; /* kept open: the segment's size is re-checked before its bytes are read */
    /* hdr NULL: not attached (BYTE_BUDGET auto and no segment yet, or the
     * segment was removed); wh__ready attaches, and creates on a put */
    uint64_t checked_ns; /* last check that the name still names our segment */
    dev_t dev;
    ino_t ino;
    bool created; /* this handle created the segment it is attached to */
    /* geometry, checked once at attach and never re-read from shared memory */
    uint32_t swap_cap;
    uint64_t slot_bytes, index_off, data_off;
    uint64_t mirror_off, mirror_size; /* a relay's reservation for the next position */
    /* the config's origin (a node-local copy's source), kept for every attach */
    char origin_id[WH_ORIGIN_ID_LEN];
    char origin_name[WH_ORIGIN_NAME_LEN];
} wh__shm_t;

static const wh_store_ops_t wh__shm_ops;

static uint64_t wh__ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* `status` tells a store whose generators stopped by this time. */
static void wh__put_seen(wh__hdr_t *h) {
    __atomic_store_n(&h->last_put_ns, wh_now_real_ns(), __ATOMIC_RELAXED);
}
static void wh__st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* Pin drops run from a view's deleter, which has no store at hand. */
#define WH__PIN_LOCK_WAIT_S 10.0

static bool wh__pid_alive(int64_t pid) {
    if (pid <= 0 || pid > INT32_MAX) return false; /* no such pid: not 1 after a cast */
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

static long wh__futex(int32_t *addr, int op, int32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

/* Takes a segment lock, waiting at most wait_s: a holder stopped (SIGSTOP,
 * a debugger, a suspended job) or a garbage owner that is alive must not
 * hang every participant. A holder that died is replaced at once: the
 * updates under these locks order their stores so that a kill after any of
 * them leaves a state the next holder can use as it is (the seal, the hole
 * and writer helpers), at worst losing some bytes until the area is reused. */
static bool wh__lock(wh__lock_t *l, double wait_s, wh_err_t *err) {
    const int32_t me = (int32_t)getpid();
    const uint64_t deadline = wh_now_mono_ns() + (uint64_t)(wait_s * 1e9);
    for (unsigned spins = 0;; spins++) {
        int32_t cur = 0;
        if (__atomic_compare_exchange_n(&l->owner, &cur, me, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return true;
        if (spins < 64) { /* held for microseconds: spin a little first */
            sched_yield();
            continue;
        }
        if (!wh__pid_alive(cur)) { /* a dead holder, or garbage: take it over */
            if (__atomic_compare_exchange_n(&l->owner, &cur, me, false, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED))
                return true;
            continue;
        }
        if (wh_now_mono_ns() >= deadline)
            return wh_err_set(err, WH_E_TIMEOUT,
                              "shm store lock held by pid %d for more than %gs: that process "
                              "is stopped (SIGSTOP, a debugger, a suspended job) or the segment "
                              "is damaged",
                              (int)cur, wait_s);
        /* sleep until a release wakes us, re-checking the holder every 2 ms */
        struct timespec ts = {0, 2000000};
        __atomic_add_fetch(&l->waiters, 1, __ATOMIC_ACQ_REL);
        wh__futex(&l->owner, FUTEX_WAIT, cur, &ts);
        __atomic_sub_fetch(&l->waiters, 1, __ATOMIC_ACQ_REL);
    }
}

static void wh__unlock(wh__lock_t *l) {
    __atomic_store_n(&l->owner, 0, __ATOMIC_RELEASE);
    if (__atomic_load_n(&l->waiters, __ATOMIC_ACQUIRE)) wh__futex(&l->owner, FUTEX_WAKE, 1, NULL);
}

static uint64_t wh__page_up(uint64_t x) { return (x + 4095) & ~(uint64_t)4095; }

static wh__entry_t *wh__index(const wh__shm_t *s, int slot) {
    return (wh__entry_t *)((char *)s->hdr + s->index_off) + (size_t)slot * s->swap_cap;
}

static char *wh__data(const wh__shm_t *s, int slot) {
    return (char *)s->hdr + s->data_off + (size_t)slot * s->slot_bytes;
}

/* Liveness is judged by pid, so every participant must share one PID
 * namespace; the namespace is recorded to refuse mixed ones clearly. */
static uint64_t wh__pidns(void) {
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static void wh__geometry(wh__shm_t *s) {
    s->swap_cap = s->hdr->swap_cap;
    s->slot_bytes = s->hdr->slot_bytes;
    s->index_off = s->hdr->index_off;
    s->data_off = s->hdr->data_off;
}

/* Segment name from the store name: only characters safe in a file name. */
static bool wh__shm_name(const char *name, char *out, size_t cap, wh_err_t *err) {
    size_t n = strlen(name);
    if (n == 0 || n > 200)
        return wh_err_set(err, WH_E_INVALID, "shm store name must be 1..200 characters");
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return wh_err_set(err, WH_E_INVALID,
                              "shm store name '%s': use only ASCII letters, digits, '-', '_', '.'",
                              name);
    }
    snprintf(out, cap, "/wirehead.%s", name);
    return true;
}

/* Views point into a read-only mapping, so a write through one faults
 * (SIGSEGV) instead of changing stored bytes. */
static bool wh__map_ro(wh__shm_t *s, int fd, wh_err_t *err) {
    void *p = wh_guard_mmap(s->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return wh_err_set(err, WH_E_SYS, "shm mmap (read-only): %s", strerror(errno));
    s->ro = p;
    return true;
}

/* This process's maps, each listed while referenced. */
static pthread_mutex_t wh__maps_mu = PTHREAD_MUTEX_INITIALIZER;
static wh__map_t *wh__maps;

static void wh__map_unref(wh__map_t *m) {
    if (!m) return;
    pthread_mutex_lock(&wh__maps_mu);
    bool last = __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0;
    if (last)
        for (wh__map_t **mm = &wh__maps; *mm; mm = &(*mm)->next)
            if (*mm == m) {
                *mm = m->next;
                break;
            }
    pthread_mutex_unlock(&wh__maps_mu);
    if (!last) return;
    wh_guard_munmap(m->rw, m->len);
    wh_guard_munmap((void *)m->ro, m->len);
    for (int i = 0; i < WH__SLOTS; i++) free(m->memo[i]);
    pthread_mutex_destroy(&m->memo_mu);
    free(m);
}

/* Slot holding generation gen, or -1 (reclaimed, or not yet opened). */
static int wh__slot_of(const wh__hdr_t *h, uint64_t gen) {
    for (int i = 0; gen && i < WH__SLOTS; i++)
        if (__atomic_load_n(&h->slots[i].gen, __ATOMIC_ACQUIRE) == gen) return i;
    return -1;
}

static bool wh__layout(uint32_t swap_cap, uint64_t slot_bytes, uint64_t *index_off,
                       uint64_t *data_off, uint64_t *total, wh_err_t *err) {
    uint64_t idx = wh__page_up(sizeof(wh__hdr_t)), idx_bytes, data_bytes, t;
    if (!wh_mul_ok((uint64_t)swap_cap * WH__SLOTS, sizeof(wh__entry_t), &idx_bytes) ||
        !wh_mul_ok(slot_bytes, WH__SLOTS, &data_bytes) ||
        !wh_add_ok(idx + wh__page_up(idx_bytes), data_bytes, &t))
        return wh_err_set(err, WH_E_INVALID, "shm store size overflows");
    *index_off = idx;
    *data_off = idx + wh__page_up(idx_bytes);
    *total = t;
    return true;
}

static bool wh__create(wh__shm_t *s, int fd, uint64_t budget, wh_err_t *err) {
    const wh_store_config_t *c = &s->base.cfg;
    uint64_t slot_bytes = wh__page_up(budget), index_off = 0, data_off = 0, total = 0;
    if (!wh__layout(c->swap_cap, slot_bytes, &index_off, &data_off, &total, err)) return false;
    /* Name the creator before the (possibly slow) fallocate, so openers
     * keep waiting for a live creator instead of calling it stale. */
    int64_t me = getpid();
    if (ftruncate(fd, (off_t)wh__page_up(sizeof(wh__hdr_t))) != 0 ||
        pwrite(fd, &me, sizeof me, offsetof(wh__hdr_t, creator_pid)) != (ssize_t)sizeof me)
        return wh_err_set(err, WH_E_SYS, "shm store '%s': %s", s->shm_name + 10, strerror(errno));
    int r = posix_fallocate(fd, 0, (off_t)total);
    if (r != 0) {
        struct statvfs vfs;
        unsigned long long avail = 0;
        if (statvfs("/dev/shm", &vfs) == 0) avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        char why[96] = "";
        if (!c->byte_budget)
            snprintf(why, sizeof why,
                     ", BYTE_BUDGET auto: sized from the first sample for "
                     "SWAP_CAP=%u",
                     c->swap_cap);
        return wh_err_set(
            err, r == ENOSPC ? WH_E_NOSPACE : WH_E_SYS,
            "shm store '%s' needs %llu bytes (4 generation areas of BYTE_BUDGET=%llu%s) "
            "but /dev/shm has %llu free (%s); lower BYTE_BUDGET or SWAP_CAP, or "
            "enlarge /dev/shm (docker: --shm-size)",
            s->shm_name + 10, (unsigned long long)total, (unsigned long long)budget, why, avail,
            strerror(r));
    }
    void *p = wh_guard_mmap(total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return wh_err_set(err, WH_E_SYS, "shm mmap: %s", strerror(errno));
    wh__hdr_t *h = p;
    s->hdr = h;
    s->map_len = total;
    if (!wh__map_ro(s, fd, err)) return false;
    /* fallocate gave zeroed pages; fill in everything but the magic */
    h->format_version = WH_FORMAT_VERSION;
    h->hdr_size = sizeof(wh__hdr_t);
    h->pidns = wh__pidns();
    h->swap_cap = c->swap_cap;
    h->schema_hash = c->schema.hash;
    h->nfields = (uint32_t)c->schema.nfields;
    memcpy(h->names, c->schema.names, sizeof h->names);
    h->slot_bytes = slot_bytes;
    h->total_bytes = total;
    h->index_off = index_off;
    h->data_off = data_off;
    h->creator_pid = getpid();
    h->created_ns = wh_now_real_ns();
    memcpy(h->origin_id, s->origin_id, sizeof h->origin_id);
    memcpy(h->origin_name, s->origin_name, sizeof h->origin_name);
    bool ok = true; /* the locks start free: the segment is zero-filled */
    if (!ok) return wh_err_set(err, WH_E_SYS, "shm: cannot create robust process-shared mutex");
    /* Generation ids start from the wall clock in nanoseconds, so they keep
     * increasing even when the store is removed and created again (no store
     * seals faster than once a nanosecond). */
    uint64_t g0 = wh_now_real_ns();
    h->slots[0].gen = g0;
    h->write_gen = g0;
    wh__geometry(s);
    __atomic_store_n(&h->magic, WH__SHM_MAGIC, __ATOMIC_RELEASE);
    return true;
}

/* A header string as printable ASCII, cut at its field's end: the
 * segment's bytes may be anything. */
static void wh__hdr_text(char *out, const char *in, size_t n) {
    size_t i = 0;
    for (; i + 1 < n && in[i]; i++)
        out[i] = (unsigned char)in[i] >= 0x20 && (unsigned char)in[i] < 0x7f ? in[i] : '?';
    out[i] = 0;
}

/* A node-local copy serves only configs of the store it mirrors: one
 * LOCAL_CACHE name given to two stores must not hand one the other's
 * samples, and a plain store is no copy. */
static bool wh__origin_ok(const wh__shm_t *s, const wh__hdr_t *h, wh_err_t *err) {
    char id[WH_ORIGIN_ID_LEN], name[WH_ORIGIN_NAME_LEN];
    wh__hdr_text(id, h->origin_id, sizeof id);
    if (!strcmp(id, s->origin_id)) return true;
    if (!id[0])
        return wh_err_set(err, WH_E_SCHEMA,
                          "shm store '%s' (LOCAL_CACHE) records no source: it is a plain shm "
                          "store, not a relay's copy of %s; give LOCAL_CACHE a name of its own "
                          "(or auto), or remove that store (`wirehead-torch clean`)",
                          s->shm_name + 10, s->origin_name);
    wh__hdr_text(name, h->origin_name, sizeof name);
    return wh_err_set(err, WH_E_SCHEMA,
                      "shm store '%s' (LOCAL_CACHE) is this node's copy of %s, not of %s (this "
                      "config's STORE); give one of them another LOCAL_CACHE name (or auto), or "
                      "remove that copy once nothing uses it (`wirehead-torch clean "
                      "--local-only`)",
                      s->shm_name + 10, name, s->origin_name);
}

/* Waits (bounded) for the creator to finish; maps and checks the store. */
static bool wh__attach(wh__shm_t *s, int fd, bool *stale, wh_err_t *err) {
    const wh_store_config_t *c = &s->base.cfg;
    *stale = false;
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)WH__OPEN_WAIT_MS * 1000000ull;
    uint64_t hard_deadline = deadline + 600ull * 1000000000ull;
    struct stat sb;
    wh__hdr_t *h = NULL;
    for (;;) {
        if (fstat(fd, &sb) != 0) return wh_err_set(err, WH_E_SYS, "shm fstat: %s", strerror(errno));
        if (sb.st_nlink == 0) { /* the creator gave up and unlinked it: open the name again */
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            *stale = false;
            return wh_err_set(err, WH_E_NOTFOUND, "shm store '%s' was removed while opening",
                              s->shm_name + 10);
        }
        /* another user's segment (or one others may write) could hand us
         * hostile bytes while we read: refuse it before mapping */
        if (sb.st_uid != geteuid() || (sb.st_mode & 0777) != 0600) {
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_INVALID,
                              "shm store '%s' belongs to uid %u with mode "
                              "%03o; a store must be owned by this user (uid %u) with mode "
                              "0600: remove it or use another name",
                              s->shm_name + 10, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777),
                              (unsigned)geteuid());
        }
        uint64_t magic = 0;
        if (sb.st_size >= (off_t)sizeof magic &&
            pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic &&
            magic == WH__SHM_MAGIC_V1) {
            /* an older build's layout (3 areas, no reader pins): refuse it
             * clearly rather than wait for it or take it for stale */
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_SCHEMA,
                              "shm store '%s' has the segment layout of an "
                              "older wirehead_torch (3 generation areas, no reader pins); this "
                              "build uses 4 areas with reader pins: stop its users and remove it "
                              "with `wirehead-torch clean`",
                              s->shm_name + 10);
        }
        if ((uint64_t)sb.st_size >= sizeof(wh__hdr_t)) {
            if (!h) {
                void *p =
                    wh_guard_mmap(sizeof(wh__hdr_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p == MAP_FAILED)
                    return wh_err_set(err, WH_E_SYS, "shm mmap: %s", strerror(errno));
                h = p;
            }
            if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == WH__SHM_MAGIC) break;
        }
        int64_t creator = h ? h->creator_pid : 0;
        uint64_t now = wh_now_mono_ns();
        /* a creator that died before finishing leaves a stale segment; a
         * live one (reserving a large store) is waited for, up to a bound */
        if (now > deadline && (!creator || !wh__pid_alive(creator))) {
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            *stale = true;
            return false;
        }
        if (now > hard_deadline) {
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_TIMEOUT,
                              "shm store '%s' is still being created by pid %lld", s->shm_name + 10,
                              (long long)creator);
        }
        wh_sleep_ms(1);
    }
    uint64_t index_off = 0, data_off = 0, total = 0;
    bool ok = true;
    uint64_t ns = wh__pidns();
    if (h->format_version != WH_FORMAT_VERSION || h->hdr_size != sizeof(wh__hdr_t)) {
        /* a header of another size: made by another build (older ones lack
         * the node-local copy's source) */
        ok = wh_err_set(err, WH_E_SCHEMA,
                        "shm store '%s' has format version %u with a %llu-byte header, this "
                        "build uses version %d with a %zu-byte one; stop its users and remove "
                        "it with `wirehead-torch clean`",
                        s->shm_name + 10, h->format_version, (unsigned long long)h->hdr_size,
                        WH_FORMAT_VERSION, sizeof(wh__hdr_t));
    } else if (h->pidns && ns && h->pidns != ns) {
        ok = wh_err_set(err, WH_E_INVALID,
                        "shm store '%s' was created in another PID namespace "
                        "(another container?); every participant of an shm store must share "
                        "one (docker: --pid=host or a shared --pid), or use a mongodb:// store",
                        s->shm_name + 10);
    } else if (h->schema_hash != c->schema.hash || h->nfields != (uint32_t)c->schema.nfields) {
        char have[WH_MAX_FIELDS * (WH_MAX_NAME + 2)] = "";
        for (uint32_t i = 0; i < h->nfields && i < WH_MAX_FIELDS; i++) {
            char nm[WH_MAX_NAME];
            memcpy(nm, h->names[i], WH_MAX_NAME);
            nm[WH_MAX_NAME - 1] = 0;
            if (i) strcat(have, ", ");
            strcat(have, nm);
        }
        char want[WH_MAX_FIELDS * (WH_MAX_NAME + 2)] = "";
        for (int i = 0; i < c->schema.nfields && i < WH_MAX_FIELDS; i++) {
            if (i) strcat(want, ", ");
            strcat(want, c->schema.names[i]);
        }
        ok = wh_err_set(err, WH_E_SCHEMA,
                        "shm store '%s' was created with SAMPLE [%s], the config's SAMPLE is "
                        "[%s]; use another store name or `wirehead-torch clean`",
                        s->shm_name + 10, have, want);
    } else if (!c->no_create && c->byte_budget && h->slot_bytes != wh__page_up(c->byte_budget)) {
        ok = wh_err_set(err, WH_E_SCHEMA,
                        "shm store '%s' was created with BYTE_BUDGET=%llu, "
                        "config says %llu; the budget is fixed when the store is created: "
                        "use the same value, or `wirehead-torch clean` and start again",
                        s->shm_name + 10, (unsigned long long)h->slot_bytes,
                        (unsigned long long)c->byte_budget);
    } else if (h->swap_cap != c->swap_cap) {
        ok = wh_err_set(err, WH_E_SCHEMA,
                        "shm store '%s' was created with SWAP_CAP=%u, config "
                        "says %u; use another store name or `wirehead-torch clean`",
                        s->shm_name + 10, h->swap_cap, c->swap_cap);
    } else if (!wh__layout(h->swap_cap, h->slot_bytes, &index_off, &data_off, &total, err) ||
               index_off != h->index_off || data_off != h->data_off || total != h->total_bytes ||
               (uint64_t)sb.st_size < total) {
        ok = wh_err_set(err, WH_E_CORRUPT, "shm store '%s': header sizes are inconsistent",
                        s->shm_name + 10);
    }
    if (ok && s->origin_id[0]) ok = wh__origin_ok(s, h, err);
    wh_guard_munmap(h, sizeof(wh__hdr_t));
    if (!ok) return false;
    void *p = wh_guard_mmap(total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return wh_err_set(err, WH_E_SYS, "shm mmap: %s", strerror(errno));
    s->hdr = p;
    s->map_len = total;
    if (!wh__map_ro(s, fd, err)) return false;
    wh__geometry(s);
    return true;
}

static void wh__unmap_partial(wh__shm_t *s);

/* Hands both mappings to a shared, counted owner (the handle's reference);
 * where this process maps the same segment already, its maps are used and
 * the new ones let go. */
static void wh__fork_register(void);
static pthread_once_t wh__fork_once;

static bool wh__share_maps(wh__shm_t *s, const struct stat *sb, wh_err_t *err) {
    pthread_once(&wh__fork_once, wh__fork_register); /* wh__maps_mu across fork */
    pthread_mutex_lock(&wh__maps_mu);
    for (wh__map_t *m = wh__maps; m; m = m->next)
        if (m->dev == sb->st_dev && m->ino == sb->st_ino && m->len == s->map_len) {
            __atomic_fetch_add(&m->refs, 1, __ATOMIC_RELAXED); /* listed: refs > 0 */
            pthread_mutex_unlock(&wh__maps_mu);
            wh__unmap_partial(s);
            s->hdr = m->rw;
            s->ro = m->ro;
            s->map = m;
            return true;
        }
    wh__map_t *m = calloc(1, sizeof *m);
    if (!m) {
        pthread_mutex_unlock(&wh__maps_mu);
        return wh_err_set(err, WH_E_SYS, "out of memory");
    }
    m->refs = 1;
    pthread_mutex_init(&m->memo_mu, NULL);
    m->rw = s->hdr;
    m->ro = s->ro;
    m->len = s->map_len;
    m->dev = sb->st_dev;
    m->ino = sb->st_ino;
    m->next = wh__maps;
    wh__maps = m;
    pthread_mutex_unlock(&wh__maps_mu);
    s->map = m;
    return true;
}

/* Unmaps what a failed create or attach left mapped (not shared yet). */
static void wh__unmap_partial(wh__shm_t *s) {
    wh_guard_munmap(s->hdr, s->map_len);
    wh_guard_munmap((void *)s->ro, s->map_len);
    s->hdr = NULL;
    s->ro = NULL;
}

/* Attaches to the segment under the name, creating it with budget bytes
 * per area when it does not exist and budget is not 0. WH_E_NOSTORE when
 * it does not exist and budget is 0. */
static bool wh__connect(wh__shm_t *s, uint64_t budget, wh_err_t *err) {
    char path[300];
    snprintf(path, sizeof path, "/dev/shm%s", s->shm_name);
    for (int attempt = 0; attempt < 5; attempt++) {
        /* made exclusively (never through a planted symlink), mode 0600 */
        int fd = budget ? wh_shmfile_create(path, 0, err) : -EEXIST;
        if (fd >= 0) {
            if (!wh__create(s, fd, budget, err)) {
                wh__unmap_partial(s);
                close(fd);
                shm_unlink(s->shm_name);
                return false;
            }
            s->fd = fd;
            s->created = true;
            break;
        }
        if (fd != -EEXIST) return false; /* err says why */
        /* something is there: used only if ours, mode 0600, a regular file */
        fd = wh_shmfile_open(path, 0, err);
        if (fd < 0) {
            if (fd == -ENOENT && !budget)
                return wh_err_set(err, WH_E_NOSTORE, "no shm store '%s' (%s)", s->shm_name + 10,
                                  path);
            if (fd == -ENOENT) continue; /* removed meanwhile: create it */
            return false;                /* refused or failed: err names the path and why */
        }
        bool stale;
        wh_err_t e = {0};
        if (wh__attach(s, fd, &stale, &e)) {
            s->fd = fd;
            s->created = false;
            break;
        }
        wh__unmap_partial(s);
        if (stale) {
            /* half-created by a dead process: remove it, unless another
             * opener already replaced it with a fresh one under the name */
            char path[300];
            struct stat mine, named;
            snprintf(path, sizeof path, "/dev/shm%s", s->shm_name);
            if (fstat(fd, &mine) == 0 && stat(path, &named) == 0 && mine.st_ino == named.st_ino)
                shm_unlink(s->shm_name);
        }
        close(fd);
        if (!stale && e.code != WH_E_NOTFOUND) {
            if (err) *err = e;
            return false;
        }
    }
    if (s->fd < 0)
        return wh_err_set(err, WH_E_SYS, "shm store %s: could not create or open it", s->shm_name);
    struct stat sb;
    bool ok = fstat(s->fd, &sb) == 0 ||
              wh_err_set(err, WH_E_SYS, "shm store %s: fstat: %s", s->shm_name, strerror(errno));
    if (!ok || !wh__share_maps(s, &sb, err)) {
        wh__unmap_partial(s);
        close(s->fd);
        s->fd = -1;
        return false;
    }
    s->dev = sb.st_dev;
    s->ino = sb.st_ino;
    s->checked_ns = wh_now_mono_ns();
    return true;
}

/* Lets go of the segment (views keep their own reference to its maps). */
static void wh__detach(wh__shm_t *s) {
    wh__map_unref(s->map);
    if (s->fd >= 0) close(s->fd);
    s->map = NULL;
    s->hdr = NULL;
    s->ro = NULL;
    s->fd = -1;
    s->created = false;
}

/* True when the store's name no longer names the segment this handle maps
 * (`wirehead-torch clean` removed it, or it was created again). */
static bool wh__replaced(const wh__shm_t *s) {
    char path[300];
    struct stat named;
    snprintf(path, sizeof path, "/dev/shm%s", s->shm_name);
    if (stat(path, &named) != 0) return errno == ENOENT;
    return named.st_dev != s->dev || named.st_ino != s->ino;
}

/* BYTE_BUDGET auto: room for SWAP_CAP samples of this one's encoded size,
 * a quarter more for samples that vary a little, and a MiB so tiny samples
 * still fit. So the segment (4 areas) takes about 5 x SWAP_CAP x sample. */
static uint64_t wh__auto_budget(const wh__shm_t *s, const wh_array_t *arr, int n) {
    wh_sample_meta_t meta;
    uint64_t per = 0, all = 0;
    if (!wh_sample_plan(&s->base.cfg.schema, arr, n, &meta, NULL)) return 0;
    if (!wh_mul_ok(meta.total_size + meta.total_size / 4, s->base.cfg.swap_cap, &per) ||
        !wh_add_ok(per, 1u << 20, &all))
        return 0;
    return wh__page_up(all);
}

#define WH__RECHECK_NS 1000000000ull /* how often a handle checks its name */

/* Every operation starts here: attaches a handle that is not attached
 * (creating the segment on a put, or with a fixed BYTE_BUDGET) and, once a
 * second, moves a handle whose segment was removed or replaced to the one
 * under the name now. arr/n: the sample of a put (NULL otherwise).
 * WH_E_NOSTORE when there is nothing to attach to. */
static bool wh__ready(wh__shm_t *s, const wh_array_t *arr, int n, wh_err_t *err) {
    const wh_store_config_t *c = &s->base.cfg;
    uint64_t now = wh_now_mono_ns();
    if (s->hdr) {
        if (now - s->checked_ns < WH__RECHECK_NS) return true;
        s->checked_ns = now;
        if (!wh__replaced(s)) return true;
        wh__detach(s);
    }
    uint64_t budget = 0;
    if (!c->no_create) {
        budget = c->byte_budget;
        if (!budget && arr) {
            budget = wh__auto_budget(s, arr, n);
            if (!budget) { /* a bad sample: let the put say why */
                wh_sample_meta_t meta;
                if (!wh_sample_plan(&c->schema, arr, n, &meta, err)) return false;
                return wh_err_set(err, WH_E_TOOBIG,
                                  "BYTE_BUDGET auto: SWAP_CAP=%u samples of "
                                  "this size overflow",
                                  c->swap_cap);
            }
        }
    }
    if (wh__connect(s, budget, err)) return true;
    if (err && err->code == WH_E_NOSTORE && !c->byte_budget && !c->no_create)
        wh_err_set(err, WH_E_NOSTORE,
                   "shm store '%s' does not exist yet: with BYTE_BUDGET auto "
                   "the first generator's first sample creates it (start a generator, or set "
                   "BYTE_BUDGET)",
                   s->shm_name + 10);
    return false;
}

wh_store_t *wh_shm_open(const wh_store_config_t *cfg, wh_err_t *err) {
    const char *name = cfg->uri + strlen("shm://");
    if (cfg->byte_budget && cfg->byte_budget < 4096)
        return wh_err_set(err, WH_E_INVALID, "BYTE_BUDGET must be at least 4096 bytes"), NULL;
    wh__shm_t *s = calloc(1, sizeof *s);
    if (!s) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    s->base.ops = &wh__shm_ops;
    s->base.cfg = *cfg;
    s->pid = getpid();
    s->fd = -1;
    if (getrandom(&s->token, sizeof s->token, 0) != sizeof s->token)
        s->token = wh_now_real_ns() ^ ((uint64_t)s->pid << 32);
    s->token |= 1;
    if (!wh__shm_name(name, s->shm_name, sizeof s->shm_name, err)) goto fail;
    if (cfg->origin_id) {
        if (!cfg->origin_id[0] || strlen(cfg->origin_id) >= sizeof s->origin_id) {
            wh_err_set(err, WH_E_INVALID, "origin_id must be 1..%d characters",
                       WH_ORIGIN_ID_LEN - 1);
            goto fail;
        }
        wh__hdr_text(s->origin_id, cfg->origin_id, sizeof s->origin_id);
        wh__hdr_text(s->origin_name, cfg->origin_name ? cfg->origin_name : "",
                     sizeof s->origin_name);
    }
    wh_err_t e = {0};
    if (wh__ready(s, NULL, 0, &e)) return &s->base;
    /* BYTE_BUDGET auto and no segment yet: every operation but a put sees
     * an empty store until a generator's first put creates it */
    if (e.code == WH_E_NOSTORE && !cfg->byte_budget && !cfg->no_create) return &s->base;
    if (e.code == WH_E_NOSTORE && cfg->no_create)
        wh_err_set(&e, WH_E_NOTFOUND, "no shm store '%s' (/dev/shm%s)", name, s->shm_name);
    if (err) *err = e;
fail:
    free(s);
    return NULL;
}

void wh_shm_layout(wh_shm_layout_t *l) {
    l->hdr_lock = offsetof(wh__hdr_t, lock);
    l->leader_pid = offsetof(wh__hdr_t, leader_pid);
    l->leader_token = offsetof(wh__hdr_t, leader_token);
    l->lease_expiry_ns = offsetof(wh__hdr_t, lease_expiry_ns);
    l->lease_ns = offsetof(wh__hdr_t, lease_ns);
    l->slots = offsetof(wh__hdr_t, slots);
    l->slot_size = sizeof(wh__slot_t);
    l->slot_lock = offsetof(wh__slot_t, lock);
    l->slot_gen = offsetof(wh__slot_t, gen);
    l->slot_used = offsetof(wh__slot_t, used);
    l->slot_count = offsetof(wh__slot_t, count);
    l->slot_nholes = offsetof(wh__slot_t, nholes);
    l->slot_holes = offsetof(wh__slot_t, holes);
    l->hdr_size = sizeof(wh__hdr_t);
}

bool wh_shm_clean(const char *name, wh_err_t *err) {
    char n[256];
    if (!wh__shm_name(name, n, sizeof n, err)) return false;
    if (shm_unlink(n) != 0 && errno != ENOENT)
        return wh_err_set(err, WH_E_SYS, "shm_unlink %s: %s", n, strerror(errno));
    return true;
}

static void wh__beat_drop(wh__shm_t *s);

static void wh__shm_destroy(wh_store_t *st) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_guard_ensure(); /* at exit too: leaving the readers' table writes the segment */
    if (getpid() == s->pid) wh__beat_drop(s);
    wh__map_unref(s->map); /* unmapped once the last view is gone too */
    if (s->fd >= 0) close(s->fd);
    free(s);
}

/* The segment's size, re-checked before its bytes are touched: a segment
 * truncated under this process (damage, a tool) is an error, not SIGBUS. */
static bool wh__intact(const wh__shm_t *s, wh_err_t *err) {
    struct stat sb;
    if (s->fd < 0) return true;
    if (fstat(s->fd, &sb) != 0) return wh_err_set(err, WH_E_SYS, "shm fstat: %s", strerror(errno));
    /* a shrink seen by the guard stays an error even if the file grew back:
     * the mapping shows zero pages past the old end, not the file */
    if (sb.st_size < 0 || (uint64_t)sb.st_size < s->map_len || wh_guard_shrunk(s->hdr) ||
        wh_guard_shrunk(s->ro))
        return wh_err_set(err, WH_E_CORRUPT,
                          "shm store '%s' (/dev/shm%s) was truncated to %lld of its %zu bytes "
                          "under this process; remove it with `wirehead-torch clean`",
                          s->shm_name + 10, s->shm_name, (long long)sb.st_size, s->map_len);
    return true;
}

/* An area's bookkeeping checked against the store's own limits before a
 * put trusts it (slot lock held): forged counts or offsets are an error. */
static bool wh__slot_sane(const wh__shm_t *s, const wh__slot_t *sl, int slot, wh_err_t *err) {
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
                          "it with `wirehead-torch clean`",
                          s->shm_name + 10, slot, bad);
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

static void wh__end_writer(wh__slot_t *sl, int i, bool keep_bytes) {
    wh__writer_t wr = sl->writers[i];
    __atomic_store_n(&sl->writers[i].pid, 0, __ATOMIC_RELEASE);
    if (sl->nwriters) sl->nwriters--;
    if (!keep_bytes) wh__add_hole(sl, wr.off, wr.size);
}

/* Drops reservations of processes that no longer exist; their bytes become
 * holes for later puts. Recounts the rest: a holder killed inside
 * wh__end_writer or a put may have left nwriters off, and a seal waits for
 * nwriters to reach 0. */
static void wh__prune_writers(wh__slot_t *sl) {
    uint32_t n = 0;
    for (int i = 0; i < WH__MAX_WRITERS; i++) {
        if (sl->writers[i].pid && !wh__pid_alive(sl->writers[i].pid)) wh__end_writer(sl, i, false);
        n += sl->writers[i].pid != 0;
    }
    sl->nwriters = n;
}

/* First fit among the holes, else the end of the area. */
static bool wh__reserve(wh__slot_t *sl, uint64_t cap, uint64_t size, uint64_t *off) {
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

static int wh__take_writer(wh__slot_t *sl, pid_t pid) {
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
        wh__prune_writers(sl);
    }
    return -1;
}

static bool wh__shm_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                        wh_put_status_t *status, uint64_t *genp, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_sample_meta_t meta;
    if (!wh__ready(s, arr, n, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh_sample_plan(&st->cfg.schema, arr, n, &meta, err) || !wh__intact(s, err)) return false;
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
        slot = wh__slot_of(h, gen);
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
        if (!wh__lock(&sl->lock, st->cfg.lease_s, err)) return false;
        if (!wh__slot_sane(s, sl, slot, err)) {
            wh__unlock(&sl->lock);
            return false;
        }
        if (wh__ld(&sl->gen) != gen) { /* a seal is switching slots */
            wh__unlock(&sl->lock);
            continue;
        }
        if (sl->count >= s->swap_cap) {
            wh__unlock(&sl->lock);
            __atomic_fetch_add(&h->discarded, 1, __ATOMIC_RELAXED);
            wh__put_seen(h);
            *status = WH_PUT_DISCARDED;
            return true;
        }
        wi = wh__take_writer(sl, s->pid);
        if (wi >= 0) sl->writers[wi].token = s->token + 2 * ++s->puts;
        bool fits = false;
        if (wi >= 0) {
            fits = wh__reserve(sl, s->slot_bytes, size, &off);
            if (!fits) {
                wh__prune_writers(sl);
                fits = wh__reserve(sl, s->slot_bytes, size, &off);
            }
            if (fits) {
                sl->writers[wi].off = off;
                sl->writers[wi].size = size;
                wh__unlock(&sl->lock);
                break;
            }
            sl->writers[wi].pid = 0;
            sl->nwriters--;
        }
        uint32_t busy = sl->nwriters, count = sl->count;
        wh__unlock(&sl->lock);
        if (!fits && busy == 0)
            return wh_err_set(err, WH_E_TOOBIG,
                              "generation %llu filled its BYTE_BUDGET of %llu bytes with only "
                              "%u of SWAP_CAP=%u samples; raise BYTE_BUDGET to at least "
                              "SWAP_CAP x sample size (%llu bytes) after `wirehead-torch clean`",
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
    if (!wh__lock(&sl->lock, st->cfg.lease_s, err)) return false;
    uint64_t token = s->token + 2 * s->puts;
    bool mine = sl->writers[wi].pid == s->pid && sl->writers[wi].token == token;
    /* an entry pruned under us means the bytes may have been handed out again */
    bool commit = mine && ok && wh__ld(&sl->gen) == gen && sl->count < s->swap_cap;
    if (mine) wh__end_writer(sl, wi, commit);
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
    wh__unlock(&sl->lock);
    return ok;
}

/* A lease runs at most its holder's LEASE_SECONDS (itself at most the
 * config's bound of 1e6 s) from now: an expiry further out (a damaged
 * segment, leader_pid 1 with a far expiry) would block takeover for ever,
 * so it counts as expired. */
static bool wh__lease_forged(const wh__hdr_t *h, uint64_t now) {
    const uint64_t max_ns = (uint64_t)1e15;
    uint64_t ns = h->lease_ns < max_ns ? h->lease_ns : max_ns;
    return h->lease_expiry_ns > now + ns + (uint64_t)1e9;
}

static bool wh__shm_lead(wh_store_t *st, bool *leader, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__ready(s, NULL, 0, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh__lock(&h->lock, st->cfg.lease_s, err)) return false;
    uint64_t now = wh_now_real_ns();
    bool mine = h->leader_token == s->token;
    bool free_ = !h->leader_token || !wh__pid_alive(h->leader_pid) || h->lease_expiry_ns < now ||
                 wh__lease_forged(h, now);
    if (mine || free_) {
        h->leader_pid = s->pid;
        h->leader_token = s->token;
        h->lease_ns = (uint64_t)(st->cfg.lease_s * 1e9);
        h->lease_expiry_ns = now + h->lease_ns;
    }
    *leader = mine || free_;
    wh__unlock(&h->lock);
    return true;
}

static bool wh__shm_resign(wh_store_t *st, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    if (!h) return true; /* not attached: no lease of ours to give up */
    if (!wh__lock(&h->lock, st->cfg.lease_s, err)) return false;
    if (h->leader_token == s->token) {
        h->leader_token = 0;
        h->leader_pid = 0;
        h->lease_expiry_ns = 0;
    }
    wh__unlock(&h->lock);
    return true;
}

/* Drops pins of reader processes that no longer exist and recounts the
 * rest (a reader killed inside wh__pin_add may have left npinners short).
 * Slot lock held. */
static void wh__prune_pins(wh__slot_t *sl) {
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

/* The slot the next write generation takes: among slots holding neither
 * the write generation w nor the read generation, the oldest one with no
 * live writer and no live reader pin. Returns it locked in *out, or -1 with
 * info naming a pid that keeps the candidates busy (a reader's pin when
 * that is what blocks). */
static bool wh__take_next_slot(wh__hdr_t *h, double wait_s, uint64_t w, wh_seal_info_t *info,
                               int *out, wh_err_t *err) {
    uint64_t rg = wh__ld(&h->read_gen);
    int order[WH__SLOTS], n = 0;
    for (int i = 0; i < WH__SLOTS; i++) {
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
        if (!wh__lock(&sl->lock, wait_s, err)) return false;
        wh__prune_writers(sl);
        wh__prune_pins(sl);
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
        wh__unlock(&sl->lock);
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

static bool wh__shm_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__ready(s, NULL, 0, err)) return false;
    wh__hdr_t *h = s->hdr;
    *sealed = false;
    uint64_t t0 = wh_now_mono_ns();
    int step = 0;
    if (!wh__lock(&h->lock, st->cfg.lease_s, err)) return false;
    if (h->leader_token != s->token || h->lease_expiry_ns < wh_now_real_ns()) {
        wh__unlock(&h->lock);
        return wh_err_set(err, WH_E_LEASE, "seal: this manager does not hold the lease");
    }
    uint64_t w = wh__ld(&h->write_gen);
    int cs = wh__slot_of(h, w);
    bool ok = true;
    if (cs < 0) {
        ok = wh_err_set(err, WH_E_CORRUPT, "shm: no area holds write generation %llu",
                        (unsigned long long)w);
        goto out;
    }
    if (__atomic_load_n(&h->slots[cs].count, __ATOMIC_ACQUIRE) < s->swap_cap) goto out;
    for (int i = 0; i < WH__SLOTS; i++) {
        wh__slot_t *sl = &h->slots[i];
        if (wh__ld(&sl->gen) <= w) continue;
        if (!wh__lock(&sl->lock, st->cfg.lease_s, err)) {
            ok = false;
            goto out;
        }
        if (wh__ld(&sl->gen) > w) wh__seal_store(&sl->gen, 0, &step);
        wh__unlock(&sl->lock);
    }
    int ns = -1;
    if (!wh__take_next_slot(h, st->cfg.lease_s, w, info, &ns, err)) {
        ok = false;
        goto out;
    }
    if (ns < 0) goto out;             /* every candidate is busy: info names who */
    wh__slot_t *next = &h->slots[ns]; /* locked by wh__take_next_slot */
    wh__seal_store(&next->gen, 0, &step);
    __atomic_store_n(&next->count, 0, __ATOMIC_RELEASE);
    wh_fault_seal_step(++step);
    wh__seal_store(&next->used, 0, &step);
    __atomic_store_n(&next->nholes, 0, __ATOMIC_RELEASE);
    wh_fault_seal_step(++step);
    wh__seal_store(&next->gen, w + 1, &step);
    wh__unlock(&next->lock);
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
    wh__unlock(&h->lock);
    return ok;
}

static bool wh__shm_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_err_t e = {0};
    *gen = 0;
    if (!wh__ready(s, NULL, 0, &e)) { /* no store yet: no generation yet */
        if (e.code == WH_E_NOSTORE) return true;
        if (err) *err = e;
        return false;
    }
    if (!wh__intact(s, err)) return false; /* zero pages would read as "no generation yet" */
    *gen = wh__ld(&s->hdr->read_gen);
    return true;
}

static bool wh__gone(uint64_t gen, wh_err_t *err) { return wh_store_err_gone(err, gen); }

/* Slot of sealed generation gen: NOTFOUND if not sealed yet, GONE if its
 * slot was recycled. */
static bool wh__sealed_slot(const wh__hdr_t *h, uint64_t gen, int *slot, wh_err_t *err) {
    uint64_t rg = wh__ld(&h->read_gen);
    if (gen == 0 || gen > rg)
        return wh_err_set(err, WH_E_NOTFOUND, "generation %llu is not sealed (newest is %llu)",
                          (unsigned long long)gen, (unsigned long long)rg);
    *slot = wh__slot_of(h, gen);
    return *slot >= 0 || wh__gone(gen, err);
}

/* A read of an attached handle (wh__ready done by the caller). */
static bool wh__read_attached(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                              wh_sample_meta_t *meta_out, wh_err_t *err);

static bool wh__shm_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                         wh_sample_meta_t *meta_out, wh_err_t *err) {
    if (!wh__ready((wh__shm_t *)st, NULL, 0, err)) return false;
    return wh__read_attached(st, gen, pos, fn, ctx, meta_out, err);
}

static bool wh__read_attached(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                              wh_sample_meta_t *meta_out, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    const wh_schema_t *schema = &st->cfg.schema;
    int slot;
    if (!wh__intact(s, err) || !wh__sealed_slot(h, gen, &slot, err)) return false;
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
    if (!wh__intact(s, err)) return false;
    if (wh__ld(&sl->gen) != gen) return wh__gone(gen, err);
    if (!ok) return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    if (meta_out) *meta_out = meta;
    return true;
}

/* ---- store-backed views and reader pins ----
 *
 * A view pins its sample's slot for its pid (count of live views); the slot
 * is never recycled while a live pid pins it. Policy: a process pins at most
 * one slot at a time, so with four slots a single reader never blocks a
 * seal (write, read and its pinned slot leave one free); several readers
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

/* Generation of another slot this pid pins, or 0. */
static uint64_t wh__pinned_elsewhere(wh__hdr_t *h, int slot, pid_t pid) {
    for (int i = 0; i < WH__SLOTS; i++) {
        if (i == slot) continue;
        for (int j = 0; j < WH__MAX_PINNERS; j++)
            if (__atomic_load_n(&h->slots[i].pins[j].pid, __ATOMIC_RELAXED) == pid &&
                __atomic_load_n(&h->slots[i].pins[j].count, __ATOMIC_RELAXED))
                return wh__ld(&h->slots[i].gen);
    }
    return 0;
}

/* Adds n pins of pid to slot (slot lock held). */
static bool wh__pin_add(wh__slot_t *sl, pid_t pid, uint32_t n, wh_err_t *err) {
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
        wh__prune_pins(sl);
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
    if (!wh__lock(&sl->lock, WH__PIN_LOCK_WAIT_S, NULL)) return;
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
    wh__unlock(&sl->lock);
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
    wh__map_unref(v->map);
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
    pthread_mutex_lock(&wh__maps_mu); /* not left locked in the child by another thread */
    if (wh__nheld && pipe2(wh__fork_pipe, O_CLOEXEC) != 0)
        wh__fork_pipe[0] = wh__fork_pipe[1] = -1; /* no pipe: the parent waits for nobody */
}

static void wh__fork_parent(void) {
    pthread_mutex_unlock(&wh__maps_mu);
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
    pthread_mutex_unlock(&wh__maps_mu);
    if (wh__fork_pipe[0] >= 0) close(wh__fork_pipe[0]);
    for (size_t i = 0; i < wh__nheld; i++) {
        wh__held_t *e = &wh__held[i];
        wh__slot_t *sl = &((wh__hdr_t *)e->map->rw)->slots[e->slot];
        wh_err_t err = {0};
        bool ok = wh__lock(&sl->lock, WH__PIN_LOCK_WAIT_S, &err);
        if (ok) {
            ok = wh__ld(&sl->gen) == e->gen
                     ? wh__pin_add(sl, me, e->views, &err)
                     : wh_err_set(&err, WH_E_GONE, "its area was reused before the child ran");
            wh__unlock(&sl->lock);
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
    return wh__ready(s, NULL, 0, err) && wh__intact(s, err) &&
           wh__sealed_slot(s->hdr, gen, slot, err);
}

/* A copy holding its generation: a pin of this process keeps the area
 * from reuse for the length of the copy, so a slow reader cannot lose the
 * race with reclamation. Outside the one-generation policy of views: it
 * lasts one copy, so a seal it blocks waits only that long. */
static bool wh__shm_read_held(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                              wh_sample_meta_t *meta, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    int slot;
    if (!wh__sealed_area(s, gen, &slot, err)) return false;
    wh__hdr_t *h = s->hdr;
    wh__slot_t *sl = &h->slots[slot];
    pthread_mutex_lock(&wh__pin_mu);
    bool ok = wh__lock(&sl->lock, st->cfg.lease_s, err);
    if (ok) {
        ok = wh__ld(&sl->gen) == gen ? wh__pin_add(sl, s->pid, 1, err) : wh__gone(gen, err);
        wh__unlock(&sl->lock);
    }
    pthread_mutex_unlock(&wh__pin_mu);
    if (!ok) return false;
    ok = wh__read_attached(st, gen, pos, fn, ctx, meta, err); /* h stays mapped */
    pthread_mutex_lock(&wh__pin_mu);
    wh__pin_drop(h, slot, gen, s->pid);
    pthread_mutex_unlock(&wh__pin_mu);
    return ok;
}

static bool wh__shm_view(wh_store_t *st, uint64_t gen, uint32_t pos, wh_buf_t **out,
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
    bool locked = wh__lock(&sl->lock, st->cfg.lease_s, err), ok = locked;
    if (ok && wh__ld(&sl->gen) != gen) ok = wh__gone(gen, err);
    uint64_t other = ok && !st->dma_views ? wh__pinned_elsewhere(h, slot, s->pid) : 0;
    if (ok && other)
        ok = wh_err_set(err, WH_E_PINNED,
                        "this process (pid %d) still holds views of generation "
                        "%llu; a process pins one generation at a time, so drop those views "
                        "(del the tensors) before viewing generation %llu, or read a copy",
                        (int)s->pid, (unsigned long long)other, (unsigned long long)gen);
    if (ok) ok = wh__pin_add(sl, s->pid, 1, err);
    if (locked) wh__unlock(&sl->lock);
    v->listed = !st->dma_views;
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
        bool known = ok && st->dma_views && wh__memo_has(s->map, slot, gen, pos);
        for (int i = 0; ok && !known && st->cfg.verify_reads && i < meta.nfields; i++)
            ok = wh_sample_verify(&st->cfg.schema, &meta, i, src + meta.f[i].offset, err);
        if (ok && !known && st->dma_views && st->cfg.verify_reads)
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

void *wh_store_view_map(const wh_buf_t *view, const void **base, size_t *len) {
    if (!view || view->release != wh__view_release) return NULL;
    wh__map_t *m = ((const wh__view_t *)view->owner)->map;
    __atomic_fetch_add(&m->refs, 1, __ATOMIC_RELAXED);
    *base = m->ro;
    *len = m->len;
    return m;
}

void wh_store_map_unref(void *map) { wh__map_unref(map); }

static bool wh__shm_status(wh_store_t *st, wh_status_t *o, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__ready(s, NULL, 0, err)) return false;
    wh__hdr_t *h = s->hdr;
    memset(o, 0, sizeof *o);
    /* never blocks for long: with the lock stuck (a stopped holder) the
     * figures are read without it, as a monitor needs them most then */
    bool locked = wh__lock(&h->lock, 0.2, NULL);
    o->store_bytes = s->map_len;
    o->creator_pid = h->creator_pid > 0 ? (uint64_t)h->creator_pid : 0;
    wh__hdr_text(o->origin_id, h->origin_id, sizeof o->origin_id);
    wh__hdr_text(o->origin_name, h->origin_name, sizeof o->origin_name);
    o->read_gen = wh__ld(&h->read_gen);
    o->write_gen = wh__ld(&h->write_gen);
    int ws = wh__slot_of(h, o->write_gen);
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
        !wh__lease_forged(h, now)) {
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
    if (locked) wh__unlock(&h->lock);
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
    return true;
}

/* A beat entry another reader may take: free, stale, or its process gone. */
static bool wh__beat_free(const wh__beat_t *e, uint64_t token, uint64_t now) {
    if (!token) return true;
    uint64_t t = __atomic_load_n(&e->beat_ns, __ATOMIC_RELAXED);
    return t + (uint64_t)(WH_READER_LIVE_S * 1e9) < now ||
           !wh__pid_alive(__atomic_load_n(&e->pid, __ATOMIC_RELAXED));
}

static bool wh__shm_beat(wh_store_t *st, const wh_reader_beat_t *b, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__ready(s, NULL, 0, err)) return false;
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
static void wh__beat_drop(wh__shm_t *s) {
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
    if (!wh__ready(s, NULL, 0, &e)) {
        if (e.code != WH_E_NOSTORE || !budget) {
            if (err) *err = e;
            return false;
        }
        if (!wh__connect(s, budget, err)) return false;
    }
    if (!wh__intact(s, err) || !wh__mirror_hold(s, err)) return false;
    wh__hdr_t *h = s->hdr;
    if (!wh__lock(&h->lock, st->cfg.lease_s, err)) return false;
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
        if (!(ok = wh__lock(&sl->lock, st->cfg.lease_s, err))) break;
        if (wh__ld(&sl->gen) > rg) wh__st(&sl->gen, 0);
        wh__unlock(&sl->lock);
    }
    /* no area holds gen now: every area but the read one is a candidate */
    if (!ok || !(ok = wh__take_next_slot(h, st->cfg.lease_s, gen, &info, &pick, err))) goto out;
    if (pick < 0) {
        ok = wh_err_set(err, WH_E_PINNED,
                        "shm store '%s': readers pin every free area (pid %llu holds "
                        "generation %llu)",
                        s->shm_name + 10, (unsigned long long)info.blocked_pid,
                        (unsigned long long)info.blocked_gen);
        goto out;
    }
    wh__slot_t *sl = &h->slots[pick]; /* locked by wh__take_next_slot */
    wh__st(&sl->gen, 0);
    __atomic_store_n(&sl->count, 0, __ATOMIC_RELEASE);
    wh__st(&sl->used, 0);
    __atomic_store_n(&sl->nholes, 0, __ATOMIC_RELEASE);
    wh__st(&sl->gen, gen);
    wh__unlock(&sl->lock);
    wh__st(&h->write_gen, gen); /* a seal now publishes gen */
out:
    wh__unlock(&h->lock);
    return ok;
}

/* The area of write generation gen, or an error saying the relay lost it. */
static int wh__mirror_slot(wh__shm_t *s, uint64_t gen, wh_err_t *err) {
    int slot = wh__slot_of(s->hdr, gen);
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
    if (!s || !wh__ready(s, NULL, 0, err) || !wh__intact(s, err) || !wh__mirror_hold(s, err))
        return false;
    int slot = wh__mirror_slot(s, gen, err);
    if (slot < 0) return false;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (!wh__lock(&sl->lock, st->cfg.lease_s, err)) return false;
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
    wh__unlock(&sl->lock);
    return ok;
}

bool wh_shm_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err) {
    wh__shm_t *s = wh__mirror_store(st, err);
    if (!s || !wh__ready(s, NULL, 0, err) || !wh__intact(s, err)) return false;
    int slot = wh__mirror_slot(s, gen, err);
    if (slot < 0) return false;
    wh__slot_t *sl = &s->hdr->slots[slot];
    if (!wh__lock(&sl->lock, st->cfg.lease_s, err)) return false;
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
    wh__unlock(&sl->lock);
    return ok;
}

static const wh_store_ops_t wh__shm_ops = {
    .scheme = "shm",
    .put = wh__shm_put,
    .lead = wh__shm_lead,
    .resign = wh__shm_resign,
    .seal = wh__shm_seal,
    .current = wh__shm_current,
    .read = wh__shm_read,
    .status = wh__shm_status,
    .view = wh__shm_view,
    .beat = wh__shm_beat,
    .beat_every_s = WH_READER_BEAT_S,
    .read_held = wh__shm_read_held,
    .params_set = wh_pfile_set,
    .params_get = wh_pfile_get,
    .params_version = wh_pfile_version,
    .destroy = wh__shm_destroy,
};
