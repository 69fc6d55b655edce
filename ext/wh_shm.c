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

#include "wh_store.h"

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
    uint64_t slot_bytes;   /* data bytes per generation area */
    uint64_t total_bytes;  /* whole segment */
    uint64_t index_off, data_off;
    int64_t creator_pid;
    uint64_t created_ns;

    wh__lock_t lock; /* lease, seal, history */
    uint64_t read_gen;    /* atomic */
    uint64_t write_gen;   /* atomic */
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
} wh__hdr_t;

/* The segment's mappings, shared by the handle and every live view, so a
 * view outlives the handle that made it. */
typedef struct {
    uint64_t refs; /* atomic */
    void *rw;      /* the store's own read-write mapping */
    const void *ro; /* the same segment mapped read-only: views point here */
    size_t len;
} wh__map_t;

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
    /* geometry, checked once at open and never re-read from shared memory */
    uint32_t swap_cap;
    uint64_t slot_bytes, index_off, data_off;
} wh__shm_t;

static const wh_store_ops_t wh__shm_ops;

static uint64_t wh__ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
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
 * hang every participant. A holder that died is replaced at once: every
 * update under these locks commits with its last store, so the protected
 * state is consistent as it is. */
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
                              "is damaged", (int)cur, wait_s);
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
                              "shm store name '%s': use only letters, digits, '-', '_', '.'",
                              name);
    }
    snprintf(out, cap, "/wirehead.%s", name);
    return true;
}

/* Views point into a read-only mapping, so a write through one faults
 * (SIGSEGV) instead of changing stored bytes. */
static bool wh__map_ro(wh__shm_t *s, int fd, wh_err_t *err) {
    void *p = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return wh_err_set(err, WH_E_SYS, "shm mmap (read-only): %s", strerror(errno));
    s->ro = p;
    return true;
}

static void wh__map_unref(wh__map_t *m) {
    if (!m || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    munmap(m->rw, m->len);
    munmap((void *)m->ro, m->len);
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

static bool wh__create(wh__shm_t *s, int fd, wh_err_t *err) {
    const wh_store_config_t *c = &s->base.cfg;
    uint64_t slot_bytes = wh__page_up(c->byte_budget), index_off = 0, data_off = 0, total = 0;
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
        if (statvfs("/dev/shm", &vfs) == 0)
            avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        return wh_err_set(err, r == ENOSPC ? WH_E_NOSPACE : WH_E_SYS,
                          "shm store '%s' needs %llu bytes (4 generation areas of BYTE_BUDGET=%llu) "
                          "but /dev/shm has %llu free (%s); lower BYTE_BUDGET or SWAP_CAP, or "
                          "enlarge /dev/shm (docker: --shm-size)",
                          s->shm_name + 10, (unsigned long long)total,
                          (unsigned long long)c->byte_budget, avail, strerror(r));
    }
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
            if (h) munmap(h, sizeof(wh__hdr_t));
            *stale = false;
            return wh_err_set(err, WH_E_NOTFOUND, "shm store '%s' was removed while opening",
                              s->shm_name + 10);
        }
        /* another user's segment (or one others may write) could hand us
         * hostile bytes while we read: refuse it before mapping */
        if (sb.st_uid != geteuid() || (sb.st_mode & 0777) != 0600) {
            if (h) munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_INVALID, "shm store '%s' belongs to uid %u with mode "
                              "%03o; a store must be owned by this user (uid %u) with mode "
                              "0600: remove it or use another name", s->shm_name + 10,
                              (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777),
                              (unsigned)geteuid());
        }
        uint64_t magic = 0;
        if (sb.st_size >= (off_t)sizeof magic &&
            pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic &&
            magic == WH__SHM_MAGIC_V1) {
            /* an older build's layout (3 areas, no reader pins): refuse it
             * clearly rather than wait for it or take it for stale */
            if (h) munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_SCHEMA, "shm store '%s' has the segment layout of an "
                              "older wirehead_torch (3 generation areas, no reader pins); this "
                              "build uses 4 areas with reader pins: stop its users and remove it "
                              "with `wirehead-torch clean`", s->shm_name + 10);
        }
        if ((uint64_t)sb.st_size >= sizeof(wh__hdr_t)) {
            if (!h) {
                void *p = mmap(NULL, sizeof(wh__hdr_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (p == MAP_FAILED) return wh_err_set(err, WH_E_SYS, "shm mmap: %s", strerror(errno));
                h = p;
            }
            if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == WH__SHM_MAGIC) break;
        }
        int64_t creator = h ? h->creator_pid : 0;
        uint64_t now = wh_now_mono_ns();
        /* a creator that died before finishing leaves a stale segment; a
         * live one (reserving a large store) is waited for, up to a bound */
        if (now > deadline && (!creator || !wh__pid_alive(creator))) {
            if (h) munmap(h, sizeof(wh__hdr_t));
            *stale = true;
            return false;
        }
        if (now > hard_deadline) {
            if (h) munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_TIMEOUT, "shm store '%s' is still being created by pid %lld",
                              s->shm_name + 10, (long long)creator);
        }
        wh_sleep_ms(1);
    }
    uint64_t index_off = 0, data_off = 0, total = 0;
    bool ok = true;
    uint64_t ns = wh__pidns();
    if (h->format_version != WH_FORMAT_VERSION || h->hdr_size != sizeof(wh__hdr_t)) {
        ok = wh_err_set(err, WH_E_SCHEMA, "shm store '%s' has format version %u, this build uses %d; "
                        "remove it with `wirehead-torch clean`", s->shm_name + 10,
                        h->format_version, WH_FORMAT_VERSION);
    } else if (h->pidns && ns && h->pidns != ns) {
        ok = wh_err_set(err, WH_E_INVALID, "shm store '%s' was created in another PID namespace "
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
        ok = wh_err_set(err, WH_E_SCHEMA, "shm store '%s' was created with SAMPLE [%s], config "
                        "says another; use another store name or `wirehead-torch clean`",
                        s->shm_name + 10, have);
    } else if (!c->no_create && h->slot_bytes != wh__page_up(c->byte_budget)) {
        ok = wh_err_set(err, WH_E_SCHEMA, "shm store '%s' was created with BYTE_BUDGET=%llu, "
                        "config says %llu; the budget is fixed when the store is created: "
                        "use the same value, or `wirehead-torch clean` and start again",
                        s->shm_name + 10, (unsigned long long)h->slot_bytes,
                        (unsigned long long)c->byte_budget);
    } else if (h->swap_cap != c->swap_cap) {
        ok = wh_err_set(err, WH_E_SCHEMA, "shm store '%s' was created with SWAP_CAP=%u, config "
                        "says %u; use another store name or `wirehead-torch clean`",
                        s->shm_name + 10, h->swap_cap, c->swap_cap);
    } else if (!wh__layout(h->swap_cap, h->slot_bytes, &index_off, &data_off, &total, err) ||
               index_off != h->index_off || data_off != h->data_off || total != h->total_bytes ||
               (uint64_t)sb.st_size < total) {
        ok = wh_err_set(err, WH_E_CORRUPT, "shm store '%s': header sizes are inconsistent",
                        s->shm_name + 10);
    }
    munmap(h, sizeof(wh__hdr_t));
    if (!ok) return false;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return wh_err_set(err, WH_E_SYS, "shm mmap: %s", strerror(errno));
    s->hdr = p;
    s->map_len = total;
    if (!wh__map_ro(s, fd, err)) return false;
    wh__geometry(s);
    return true;
}

/* Hands both mappings to a shared, counted owner (the handle's reference). */
static bool wh__share_maps(wh__shm_t *s, wh_err_t *err) {
    wh__map_t *m = calloc(1, sizeof *m);
    if (!m) return wh_err_set(err, WH_E_SYS, "out of memory");
    m->refs = 1;
    m->rw = s->hdr;
    m->ro = s->ro;
    m->len = s->map_len;
    s->map = m;
    return true;
}

wh_store_t *wh_shm_open(const wh_store_config_t *cfg, wh_err_t *err) {
    const char *name = cfg->uri + strlen("shm://");
    if (cfg->byte_budget < 4096)
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
    for (int attempt = 0; attempt < 5; attempt++) {
        int fd = cfg->no_create ? -1 : shm_open(s->shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (cfg->no_create) errno = EEXIST;
        if (fd >= 0) {
            /* 0600 whatever the umask: openers refuse any other mode */
            bool ok = (fchmod(fd, 0600) == 0 ||
                       wh_err_set(err, WH_E_SYS, "shm fchmod: %s", strerror(errno))) &&
                      wh__create(s, fd, err);
            if (!ok) {
                close(fd);
                shm_unlink(s->shm_name);
                goto fail;
            }
            s->fd = fd;
            if (!wh__share_maps(s, err)) goto fail;
            return &s->base;
        }
        if (errno != EEXIST) {
            wh_err_set(err, WH_E_SYS, "shm_open %s: %s", s->shm_name, strerror(errno));
            goto fail;
        }
        fd = shm_open(s->shm_name, O_RDWR, 0600);
        if (fd < 0) {
            if (errno == ENOENT && cfg->no_create) {
                wh_err_set(err, WH_E_NOTFOUND, "no shm store '%s' (/dev/shm%s)", name,
                           s->shm_name);
                goto fail;
            }
            if (errno == ENOENT) continue; /* removed meanwhile: create it */
            wh_err_set(err, WH_E_SYS, "shm_open %s: %s", s->shm_name, strerror(errno));
            goto fail;
        }
        bool stale;
        wh_err_t e = {0};
        bool ok = wh__attach(s, fd, &stale, &e);
        if (ok) {
            s->fd = fd;
            if (!wh__share_maps(s, err)) goto fail;
            return &s->base;
        }
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
            goto fail;
        }
    }
    wh_err_set(err, WH_E_SYS, "shm store %s: could not create or open it", s->shm_name);
fail:
    if (s->fd >= 0) close(s->fd);
    if (s->hdr) munmap(s->hdr, s->map_len);
    if (s->ro) munmap((void *)s->ro, s->map_len);
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
}

bool wh_shm_clean(const char *name, wh_err_t *err) {
    char n[256];
    if (!wh__shm_name(name, n, sizeof n, err)) return false;
    if (shm_unlink(n) != 0 && errno != ENOENT)
        return wh_err_set(err, WH_E_SYS, "shm_unlink %s: %s", n, strerror(errno));
    return true;
}

static void wh__shm_destroy(wh_store_t *st) {
    wh__shm_t *s = (wh__shm_t *)st;
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
    if (sb.st_size < 0 || (uint64_t)sb.st_size < s->map_len)
        return wh_err_set(err, WH_E_CORRUPT,
                          "shm store '%s' was truncated to %lld of its %zu bytes; remove it "
                          "with `wirehead-torch clean`", s->shm_name + 10,
                          (long long)sb.st_size, s->map_len);
    return true;
}

/* An area's bookkeeping checked against the store's own limits before a
 * put trusts it (slot lock held): forged counts or offsets are an error. */
static bool wh__slot_sane(const wh__shm_t *s, const wh__slot_t *sl, int slot, wh_err_t *err) {
    const char *bad = NULL;
    uint64_t end;
    if (sl->used > s->slot_bytes) bad = "used bytes beyond the area";
    else if (sl->count > s->swap_cap) bad = "more samples than SWAP_CAP";
    else if (sl->nholes > WH__MAX_HOLES) bad = "hole count";
    else if (sl->nwriters > WH__MAX_WRITERS) bad = "writer count";
    for (uint32_t i = 0; !bad && i < sl->nholes; i++)
        if (!wh_add_ok(sl->holes[i].off, sl->holes[i].size, &end) || end > sl->used)
            bad = "a hole outside the used bytes";
    for (int i = 0; !bad && i < WH__MAX_WRITERS; i++)
        if (sl->writers[i].pid &&
            (!wh_add_ok(sl->writers[i].off, sl->writers[i].size, &end) || end > sl->used))
            bad = "a reservation outside the used bytes";
    if (bad)
        return wh_err_set(err, WH_E_CORRUPT, "shm store '%s' area %d is damaged (%s); remove "
                          "it with `wirehead-torch clean`", s->shm_name + 10, slot, bad);
    return true;
}

/* Slot lock held for all of these. */
static void wh__add_hole(wh__slot_t *sl, uint64_t off, uint64_t size) {
    if (size && sl->nholes < WH__MAX_HOLES) sl->holes[sl->nholes++] = (wh__hole_t){off, size};
}

static void wh__end_writer(wh__slot_t *sl, int i, bool keep_bytes) {
    if (!keep_bytes) wh__add_hole(sl, sl->writers[i].off, sl->writers[i].size);
    sl->writers[i].pid = 0;
    sl->nwriters--;
}

/* Drops reservations of processes that no longer exist; their bytes become
 * holes for later puts. */
static void wh__prune_writers(wh__slot_t *sl) {
    for (int i = 0; i < WH__MAX_WRITERS && sl->nwriters; i++)
        if (sl->writers[i].pid && !wh__pid_alive(sl->writers[i].pid)) wh__end_writer(sl, i, false);
}

/* First fit among the holes, else the end of the area. */
static bool wh__reserve(wh__slot_t *sl, uint64_t cap, uint64_t size, uint64_t *off) {
    for (uint32_t i = 0; i < sl->nholes; i++) {
        wh__hole_t *h = &sl->holes[i];
        if (h->size < size) continue;
        *off = h->off;
        h->off += size;
        h->size -= size;
        if (!h->size) sl->holes[i] = sl->holes[--sl->nholes];
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
                sl->writers[i].pid = pid;
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
    wh__hdr_t *h = s->hdr;
    wh_sample_meta_t meta;
    if (!wh_sample_plan(&st->cfg.schema, arr, n, &meta, err) || !wh__intact(s, err)) return false;
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
        *status = WH_PUT_ACCEPTED;
    } else if (ok) {
        __atomic_fetch_add(&h->discarded, 1, __ATOMIC_RELAXED);
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
static bool wh__take_next_slot(wh__hdr_t *h, double wait_s, uint64_t w, wh_seal_info_t *info, int *out,
                               wh_err_t *err) {
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

static bool wh__shm_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    *sealed = false;
    uint64_t t0 = wh_now_mono_ns();
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
    int ns = -1;
    if (!wh__take_next_slot(h, st->cfg.lease_s, w, info, &ns, err)) {
        ok = false;
        goto out;
    }
    if (ns < 0) goto out; /* every candidate is busy: info names who */
    wh__slot_t *next = &h->slots[ns]; /* locked by wh__take_next_slot */
    wh__st(&next->gen, w + 1); /* readers of the old generation now see GONE */
    next->used = 0;
    next->nholes = 0;
    __atomic_store_n(&next->count, 0, __ATOMIC_RELEASE);
    wh__unlock(&next->lock);
    wh__st(&h->read_gen, w); /* the swap: one atomic store */
    wh__st(&h->write_gen, w + 1);
    uint64_t seals = __atomic_add_fetch(&h->seals, 1, __ATOMIC_RELAXED);
    WH_UNUSED(seals);
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
    h->hist_next = (k + 1) % WH__HIST;
    if (h->hist_n < WH__HIST) h->hist_n++;
    *sealed = true;
out:
    wh__unlock(&h->lock);
    return ok;
}

static bool wh__shm_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    WH_UNUSED(err);
    *gen = wh__ld(&((wh__shm_t *)st)->hdr->read_gen);
    return true;
}

static bool wh__gone(uint64_t gen, wh_err_t *err) {
    return wh_store_err_gone(err, gen);
}

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

static bool wh__shm_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
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
        if (dst[i]) ok = wh_sample_copy_field(src, schema, &meta, i, dst[i], st->cfg.verify_reads, err);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
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
        return wh_err_set(err, WH_E_PINNED, "%d reader processes already hold views of this "
                          "generation; read copies instead", WH__MAX_PINNERS);
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
    pthread_mutex_lock(&wh__pin_mu);
    wh__pin_drop(v->map->rw, v->slot, v->gen, getpid());
    wh__held_drop(v->map, v->slot, v->gen);
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
        bool ok = wh__lock(&sl->lock, WH__PIN_LOCK_WAIT_S, &err);
        if (ok) {
            ok = wh__ld(&sl->gen) == e->gen
                     ? wh__pin_add(sl, me, e->views, &err)
                     : wh_err_set(&err, WH_E_GONE, "its area was reused before the child ran");
            wh__unlock(&sl->lock);
        }
        if (!ok) { /* the child's views of e->gen may show other bytes: say so */
            char msg[WH_ERR_LEN + 200]; /* no stdio: a parent thread may hold its locks */
            int n = snprintf(msg, sizeof msg, "wirehead_torch: forked process %d could not "
                             "pin generation %llu for the %u store-backed views it inherited "
                             "(%s); do not use them\n", (int)me, (unsigned long long)e->gen,
                             e->views, err.message);
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

/* A copy holding its generation: a pin of this process keeps the area
 * from reuse for the length of the copy, so a slow reader cannot lose the
 * race with reclamation. Outside the one-generation policy of views: it
 * lasts one copy, so a seal it blocks waits only that long. */
static bool wh__shm_read_held(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn,
                              void *ctx, wh_sample_meta_t *meta, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    int slot;
    if (!wh__intact(s, err) || !wh__sealed_slot(h, gen, &slot, err)) return false;
    wh__slot_t *sl = &h->slots[slot];
    pthread_mutex_lock(&wh__pin_mu);
    bool ok = wh__lock(&sl->lock, st->cfg.lease_s, err);
    if (ok) {
        ok = wh__ld(&sl->gen) == gen ? wh__pin_add(sl, s->pid, 1, err) : wh__gone(gen, err);
        wh__unlock(&sl->lock);
    }
    pthread_mutex_unlock(&wh__pin_mu);
    if (!ok) return false;
    ok = wh__shm_read(st, gen, pos, fn, ctx, meta, err);
    pthread_mutex_lock(&wh__pin_mu);
    wh__pin_drop(h, slot, gen, s->pid);
    pthread_mutex_unlock(&wh__pin_mu);
    return ok;
}

static bool wh__shm_view(wh_store_t *st, uint64_t gen, uint32_t pos, wh_buf_t **out,
                         wh_sample_meta_t *meta_out, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    int slot;
    if (!wh__intact(s, err) || !wh__sealed_slot(h, gen, &slot, err)) return false;
    wh__slot_t *sl = &h->slots[slot];
    wh__view_t *v = calloc(1, sizeof *v);
    if (!v) return wh_err_set(err, WH_E_SYS, "out of memory");
    pthread_once(&wh__fork_once, wh__fork_register);
    pthread_mutex_lock(&wh__pin_mu);
    bool locked = wh__lock(&sl->lock, st->cfg.lease_s, err), ok = locked;
    if (ok && wh__ld(&sl->gen) != gen) ok = wh__gone(gen, err);
    uint64_t other = ok ? wh__pinned_elsewhere(h, slot, s->pid) : 0;
    if (ok && other)
        ok = wh_err_set(err, WH_E_PINNED, "this process (pid %d) still holds views of generation "
                        "%llu; a process pins one generation at a time, so drop those views "
                        "(del the tensors) before viewing generation %llu, or read a copy",
                        (int)s->pid, (unsigned long long)other, (unsigned long long)gen);
    if (ok) ok = wh__pin_add(sl, s->pid, 1, err);
    if (locked) wh__unlock(&sl->lock);
    if (ok && !wh__held_add(s->map, slot, gen)) {
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
        for (int i = 0; ok && st->cfg.verify_reads && i < meta.nfields; i++)
            ok = wh_sample_verify(&st->cfg.schema, &meta, i, src + meta.f[i].offset, err);
    }
    if (!ok) {
        pthread_mutex_lock(&wh__pin_mu);
        wh__pin_drop(h, slot, gen, s->pid);
        wh__held_drop(s->map, slot, gen);
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

static bool wh__shm_status(wh_store_t *st, wh_status_t *o, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh__hdr_t *h = s->hdr;
    memset(o, 0, sizeof *o);
    /* never blocks for long: with the lock stuck (a stopped holder) the
     * figures are read without it, as a monitor needs them most then */
    bool locked = wh__lock(&h->lock, 0.2, NULL);
    WH_UNUSED(err);
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
    return true;
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
    .read_held = wh__shm_read_held,
    .destroy = wh__shm_destroy,
};
