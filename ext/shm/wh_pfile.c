/* The shm backend's parameters side file (docs/params.md). The store's
 * params calls over the backends are in wh_store.c; the count of a
 * generation's params versions both backends make is in wh_backend.c.
 *
 * The side file (wh_shm_files: WH_SHMFILE_PARAMS and the store's name,
 * never a segment's name) holds a header and two slots. A set, under the
 * file's pid lock, writes version v into slot v % 2 inside a seqlock (seq
 * odd while it writes), then publishes v in the header. A read takes no
 * lock: it copies the slot the header names and keeps the copy only when
 * seq was even and unchanged around it, the slot's version is the one
 * named and the XXH3 of the bytes matches; so a killed reader leaves
 * nothing, and a killed setter leaves the last published version whole. */
#define _GNU_SOURCE
#define XXH_STATIC_LINKING_ONLY
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "wh_guard.h"
#include "wh_pfile.h"
#include "wh_shmfile.h"

#define WH__PF_MAGIC 0x314d524150484857ull /* "WHHPARM1" */
#define WH__PF_READ_TRIES 1000
#define WH__PF_RECHECK_NS 1000000000ull /* how often a handle checks the name */

typedef struct {
    uint64_t seq;     /* atomic: odd while a set writes this slot */
    uint64_t version; /* the version these bytes are */
    uint64_t len;
    uint64_t sum; /* XXH3 of the len bytes */
    char data[WH_PARAMS_MAX];
} wh__pslot_t;

typedef struct {
    uint64_t magic; /* 0 (fresh: all zero is "never set") or WH__PF_MAGIC */
    int32_t owner;  /* atomic: the setter's pid, 0 when free */
    uint32_t pad;
    uint64_t version; /* atomic: newest complete version, 0: never set */
    wh__pslot_t slot[2];
} wh__pfhdr_t;

struct wh_pfile {
    char path[256];
    wh__pfhdr_t *h;
    int fd;
    dev_t dev;
    ino_t ino;
    uint64_t checked_ns;
    uint64_t absent_ns; /* last time the file was found absent (retry later) */
};

/* ---- the side file ---- */

wh_pfile_t *wh_pfile_new(const char *path) {
    wh_pfile_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    snprintf(p->path, sizeof p->path, "%s", path);
    p->fd = -1;
    return p;
}

static bool wh__pf_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

static void wh__pf_drop(struct wh_pfile *p) {
    wh_guard_ensure();
    wh_guard_munmap(p->h, sizeof *p->h);
    if (p->fd >= 0) close(p->fd);
    p->h = NULL;
    p->fd = -1;
}

static bool wh__pf_map(struct wh_pfile *p, int fd, const char *path, wh_err_t *err) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return wh_err_set(err, WH_E_SYS, "%s: fstat: %s", path, strerror(errno));
    }
    void *m = wh_guard_mmap(sizeof(wh__pfhdr_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return wh_err_set(err, WH_E_SYS, "%s: mmap: %s", path, strerror(errno));
    }
    p->h = m;
    p->fd = fd;
    p->dev = sb.st_dev;
    p->ino = sb.st_ino;
    p->checked_ns = wh_now_mono_ns();
    uint64_t magic = __atomic_load_n(&p->h->magic, __ATOMIC_ACQUIRE);
    if (magic != 0 && magic != WH__PF_MAGIC) {
        wh__pf_drop(p);
        return wh_err_set(err, WH_E_CORRUPT, "%s is not a params file of this build", path);
    }
    return true;
}

/* Attaches the handle to the side file (creating it when create is set).
 * *absent: no file and create not set (version 0). A handle notices within
 * a second a file removed (`clean`) or made again. */
static bool wh__pf_ready(wh_pfile_t *p, bool create, bool *absent, wh_err_t *err) {
    *absent = false;
    const char *path = p->path;
    uint64_t now = wh_now_mono_ns();
    if (p->h) {
        if (now - p->checked_ns < WH__PF_RECHECK_NS) return true;
        p->checked_ns = now;
        struct stat named;
        if (stat(path, &named) == 0 && named.st_dev == p->dev && named.st_ino == p->ino)
            return true;
        wh__pf_drop(p);
    }
    /* an absent file is looked for again at most every 0.1 s when reading */
    if (!create && p->absent_ns && now - p->absent_ns < 100000000ull) {
        *absent = true;
        return true;
    }
    for (int attempt = 0; attempt < 200; attempt++) {
        wh_err_t e = {0};
        int fd = wh_shmfile_open(path, sizeof(wh__pfhdr_t), &e);
        if (fd >= 0) {
            p->absent_ns = 0;
            return wh__pf_map(p, fd, path, err);
        }
        if (fd == -ENOENT && !create) {
            p->absent_ns = now ? now : 1;
            *absent = true;
            return true;
        }
        if (fd == -ENOENT) {
            fd = wh_shmfile_create(path, sizeof(wh__pfhdr_t), &e);
            if (fd >= 0) return wh__pf_map(p, fd, path, err); /* zero-filled: version 0 */
            if (fd == -EEXIST) continue;                      /* another setter made it */
        } else if (fd == -EFBIG) {
            /* being made (not yet reserved): wait for its creator a little */
            wh_sleep_ms(5);
            continue;
        }
        if (err) *err = e;
        return false;
    }
    return wh_err_set(err, WH_E_TIMEOUT,
                      "%s stays shorter than a params file: remove it (`wirehead-torch clean` or "
                      "wt.clean(config))",
                      path);
}

static bool wh__pf_lock(wh__pfhdr_t *h, double wait_s, const char *path, wh_err_t *err) {
    const int32_t me = (int32_t)getpid();
    const uint64_t deadline = wh_now_mono_ns() + (uint64_t)(wait_s * 1e9);
    for (unsigned spins = 0;; spins++) {
        int32_t cur = 0;
        if (__atomic_compare_exchange_n(&h->owner, &cur, me, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return true;
        if (!wh__pf_alive(cur) && __atomic_compare_exchange_n(&h->owner, &cur, me, false,
                                                              __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return true; /* its holder died: every state it leaves is whole (above) */
        if (wh_now_mono_ns() >= deadline)
            return wh_err_set(err, WH_E_TIMEOUT,
                              "%s: lock held by pid %d for more than %gs (a stopped setter?)", path,
                              (int)cur, wait_s);
        if (spins < 64)
            sched_yield();
        else
            wh_sleep_ms(1);
    }
}

/* The file still holds every mapped byte and is still ours (a file
 * truncated under us is this error, not a SIGBUS at the next load). */
static bool wh__pf_intact(const wh_pfile_t *p, wh_err_t *err) {
    uint64_t have = 0;
    if (!wh_shmfile_check(p->fd, p->path, sizeof(wh__pfhdr_t), &have, err)) return false;
    if (wh_guard_shrunk(p->h)) /* zero pages since, even if grown back */
        return wh_err_set(err, WH_E_CORRUPT,
                          "%s was truncated under this process (%llu bytes now, %zu mapped)",
                          p->path, (unsigned long long)have, sizeof(wh__pfhdr_t));
    return true;
}

bool wh_pfile_set(wh_pfile_t *p, double wait_s, const char *doc, size_t len, uint64_t *version,
                  wh_err_t *err) {
    bool absent;
    if (!wh__pf_ready(p, true, &absent, err) || !wh__pf_intact(p, err)) return false;
    wh__pfhdr_t *h = p->h;
    if (!wh__pf_lock(h, wait_s, p->path, err)) return false;
    uint64_t v = __atomic_load_n(&h->version, __ATOMIC_ACQUIRE) + 1;
    wh__pslot_t *s = &h->slot[v % 2];
    uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_RELAXED) | 1; /* odd: being written */
    __atomic_store_n(&s->seq, q, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(s->data, doc, len);
    s->len = len;
    s->sum = XXH3_64bits(doc, len);
    s->version = v;
    __atomic_store_n(&s->seq, q + 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&h->magic, __ATOMIC_RELAXED) != WH__PF_MAGIC)
        __atomic_store_n(&h->magic, WH__PF_MAGIC, __ATOMIC_RELEASE);
    __atomic_store_n(&h->version, v, __ATOMIC_RELEASE); /* the commit point */
    __atomic_store_n(&h->owner, 0, __ATOMIC_RELEASE);
    *version = v;
    return true;
}

bool wh_pfile_version(wh_pfile_t *p, uint64_t *version, wh_err_t *err) {
    bool absent;
    *version = 0;
    if (!wh__pf_ready(p, false, &absent, err)) return false;
    if (absent) return true;
    if (!wh__pf_intact(p, err)) return false;
    *version = __atomic_load_n(&p->h->version, __ATOMIC_ACQUIRE);
    return true;
}

bool wh_pfile_get(wh_pfile_t *p, uint64_t *version, char **doc, size_t *len, wh_err_t *err) {
    bool absent;
    const char *path = p->path;
    *doc = NULL;
    if (!wh__pf_ready(p, false, &absent, err) || (!absent && !wh__pf_intact(p, err))) return false;
    char *buf = malloc(WH_PARAMS_MAX + 1);
    if (!buf) return wh_err_set(err, WH_E_SYS, "out of memory");
    if (absent || !__atomic_load_n(&p->h->version, __ATOMIC_ACQUIRE)) {
        memcpy(buf, "{}", 3);
        *doc = buf;
        *len = 2;
        *version = 0;
        return true;
    }
    wh__pfhdr_t *h = p->h;
    for (int tries = 0; tries < WH__PF_READ_TRIES; tries++) {
        uint64_t v = __atomic_load_n(&h->version, __ATOMIC_ACQUIRE);
        const wh__pslot_t *s = &h->slot[v % 2];
        uint64_t q1 = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        uint64_t n = __atomic_load_n(&s->len, __ATOMIC_RELAXED);
        uint64_t sv = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
        uint64_t sum = __atomic_load_n(&s->sum, __ATOMIC_RELAXED);
        bool fits = n <= WH_PARAMS_MAX; /* validated before it sizes the copy */
        if (fits) memcpy(buf, s->data, n);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        uint64_t q2 = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
        if ((q1 & 1) || q1 != q2 || sv != v) { /* a set overtook this read: again */
            if (tries > 16) wh_sleep_ms(1);
            continue;
        }
        if (!wh__pf_intact(p, err)) { /* it read zero pages, not the file */
            free(buf);
            return false;
        }
        if (!fits || XXH3_64bits(buf, n) != sum) {
            free(buf);
            return wh_err_set(err, WH_E_CORRUPT,
                              "%s: params version %llu fails its check (length %llu)", path,
                              (unsigned long long)v, (unsigned long long)n);
        }
        buf[n] = 0;
        *doc = buf;
        *len = n;
        *version = v;
        return true;
    }
    free(buf);
    return wh_err_set(err, WH_E_TIMEOUT, "%s: sets kept overtaking the read", path);
}

void wh_pfile_destroy(wh_pfile_t *p) {
    if (!p) return;
    wh__pf_drop(p);
    free(p);
}

bool wh_pfile_clean(const char *path, wh_err_t *err) {
    if (unlink(path) != 0 && errno != ENOENT)
        return wh_err_set(err, WH_E_SYS, "remove %s: %s", path, strerror(errno));
    return true;
}
