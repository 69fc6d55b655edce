/* Embedded backend: WH_SHM_AREAS generation areas (slots) in one POSIX
 * shared-memory segment. Each slot records the generation it holds; a seal
 * picks the next write slot among those holding neither the write nor the
 * read generation, and skips any a reader still pins (store-backed views).
 *
 * Concurrency: writers reserve bytes and commit positions under the slot's
 * lock (a pid word, wh__shm_lock; the commit point is the store of count,
 * after the index entry); readers take no lock: they check the slot's
 * generation before and after copying (a seqlock) and report WH_E_GONE if
 * it changed. A slot is recycled only when no live writer still has a
 * reservation in it and no live reader pins it. */

/* This file, the bottom room of shm/: the segment (its name and files,
 * locks, create, attach, layout and intact checks, the process's shared
 * maps). */
#define _GNU_SOURCE
#include "wh_shm_int.h"

static long wh__futex(int32_t *addr, int op, int32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

/* Takes a segment lock, waiting at most wait_s: a holder stopped (SIGSTOP,
 * a debugger, a suspended job) or a garbage owner that is alive must not
 * hang every participant. A holder that died is replaced at once: the
 * updates under these locks order their stores so that a kill after any of
 * them leaves a state the next holder can use as it is (the seal, the hole
 * and writer helpers), at worst losing some bytes until the area is reused. */
bool wh__shm_lock(wh__lock_t *l, double wait_s, wh_err_t *err) {
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

void wh__shm_unlock(wh__lock_t *l) {
    __atomic_store_n(&l->owner, 0, __ATOMIC_RELEASE);
    if (__atomic_load_n(&l->waiters, __ATOMIC_ACQUIRE)) wh__futex(&l->owner, FUTEX_WAKE, 1, NULL);
}

static uint64_t wh__page_up(uint64_t x) { return (x + 4095) & ~(uint64_t)4095; }

/* Liveness is judged by pid, so every participant must share one PID
 * namespace; the namespace is recorded to refuse mixed ones clearly. */
static uint64_t wh__pidns(void) {
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* The handle's geometry, from values checked against each other and the
 * mapping's size (never read again from the segment, which may change). */
static void wh__geometry(wh__shm_t *s, uint32_t swap_cap, uint64_t slot_bytes, uint64_t index_off,
                         uint64_t spec_off, uint64_t data_off) {
    s->swap_cap = swap_cap;
    s->slot_bytes = slot_bytes;
    s->index_off = index_off;
    s->data_off = data_off;
    s->spec_off = spec_off;
}

/* A store name: only characters safe in a file name. */
bool wh_shm_check_name(const char *name, wh_err_t *err) {
    size_t n = strlen(name);
    if (n == 0 || n > WH_SHM_NAME_MAX)
        return wh_err_set(err, WH_E_INVALID, "shm store name must be 1..%d characters",
                          WH_SHM_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return wh_err_set(err, WH_E_INVALID,
                              "shm store name '%s': use only ASCII letters, digits, '-', '_', '.'",
                              name);
    }
    return true;
}

bool wh_shm_files(const char *name, wh_shm_files_t *out, wh_err_t *err) {
    if (!wh_shm_check_name(name, err)) return false;
    const char *d = WH_SHMFILE_DIR;
    snprintf(out->segment, sizeof out->segment, "%s/" WH_SHMFILE_SEGMENT "%s", d, name);
    snprintf(out->params, sizeof out->params, "%s/" WH_SHMFILE_PARAMS "%s", d, name);
    snprintf(out->relay_lock, sizeof out->relay_lock, "%s/" WH_SHMFILE_RELAY "%s.lock", d, name);
    snprintf(out->relay_state, sizeof out->relay_state, "%s/" WH_SHMFILE_RELAY "%s.json", d, name);
    return true;
}

/* shm_open(3)'s name of the segment (its path less the directory): for
 * shm_unlink. */
static const char *wh__posix_name(const wh__shm_t *s) {
    return s->files.segment + strlen(WH_SHMFILE_DIR);
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

/* Not left locked in a forked child by another thread. Registered before
 * the first map is shared, so before the pins' handlers (wh_shm_view.c):
 * a fork takes the pins' lock first, then this one. */
static void wh__maps_lock(void) { pthread_mutex_lock(&wh__maps_mu); }
static void wh__maps_unlock(void) { pthread_mutex_unlock(&wh__maps_mu); }
static pthread_once_t wh__maps_fork_once = PTHREAD_ONCE_INIT;
static void wh__maps_fork_register(void) {
    pthread_atfork(wh__maps_lock, wh__maps_unlock, wh__maps_unlock);
}

void wh__shm_map_unref(wh__map_t *m) {
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
    for (int i = 0; i < WH_SHM_AREAS; i++) free(m->memo[i]);
    pthread_mutex_destroy(&m->memo_mu);
    free(m);
}

/* Slot holding generation gen, or -1 (reclaimed, or not yet opened). */
int wh__shm_slot_of(const wh__hdr_t *h, uint64_t gen) {
    for (int i = 0; gen && i < WH_SHM_AREAS; i++)
        if (__atomic_load_n(&h->slots[i].gen, __ATOMIC_ACQUIRE) == gen) return i;
    return -1;
}

/* header, index, the spec region (spec mode only), then the data areas */
static bool wh__layout(uint32_t swap_cap, uint64_t slot_bytes, bool spec, uint64_t *index_off,
                       uint64_t *spec_off, uint64_t *data_off, uint64_t *total, wh_err_t *err) {
    uint64_t idx = wh__page_up(sizeof(wh__hdr_t)), idx_bytes, data_bytes, t;
    if (!wh_mul_ok((uint64_t)swap_cap * WH_SHM_AREAS, sizeof(wh__entry_t), &idx_bytes) ||
        !wh_mul_ok(slot_bytes, WH_SHM_AREAS, &data_bytes) ||
        !wh_add_ok(idx + wh__page_up(idx_bytes) + wh__page_up(wh__spec_bytes(swap_cap, spec)),
                   data_bytes, &t))
        return wh_err_set(err, WH_E_INVALID, "shm store size overflows");
    *index_off = idx;
    *spec_off = idx + wh__page_up(idx_bytes);
    *data_off = *spec_off + wh__page_up(wh__spec_bytes(swap_cap, spec));
    *total = t;
    return true;
}

/* The segment's first state: its header's pages, naming its creator, so
 * openers wait for a live creator instead of calling the store stale. */
static bool wh__name_creator(const wh__shm_t *s, int fd, wh_err_t *err) {
    int64_t me = getpid();
    if (ftruncate(fd, (off_t)wh__page_up(sizeof(wh__hdr_t))) != 0 ||
        pwrite(fd, &me, sizeof me, offsetof(wh__hdr_t, creator_pid)) != (ssize_t)sizeof me)
        return wh_err_set(err, WH_E_SYS, "shm store '%s': %s", s->name, strerror(errno));
    return true;
}

/* A new segment at path, named only once it is in its first state (above):
 * so a segment shorter than its header, 0 bytes included, was cut by
 * someone (wh__attach). Where /dev/shm makes no unnamed files it is named
 * empty and put in that state at once. Returns the descriptor, or a
 * negative errno (-EEXIST: something is at path) with err set. */
static int wh__create_file(const wh__shm_t *s, const char *path, wh_err_t *err) {
    int fd = wh_shmfile_create_unnamed(path, err);
    int e = fd;
    if (fd >= 0) {
        e = wh__name_creator(s, fd, err) ? wh_shmfile_link(fd, path, err) : -EIO;
        if (e) close(fd);
    }
    if (e == -EOPNOTSUPP) return wh_shmfile_create(path, 0, err);
    return e ? e : fd;
}

static bool wh__create(wh__shm_t *s, int fd, uint64_t budget, wh_err_t *err) {
    const wh_store_config_t *c = &s->base.cfg;
    uint64_t slot_bytes = wh__page_up(budget), index_off = 0, spec_off = 0, data_off = 0, total = 0;
    if (!wh__layout(c->swap_cap, slot_bytes, c->spec, &index_off, &spec_off, &data_off, &total,
                    err))
        return false;
    /* (already so unless made by the fallback of wh__create_file) */
    if (!wh__name_creator(s, fd, err)) return false;
    int r = posix_fallocate(fd, 0, (off_t)total);
    if (r != 0) {
        struct statvfs vfs;
        unsigned long long avail = 0;
        if (statvfs(WH_SHMFILE_DIR, &vfs) == 0)
            avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
        char why[96] = "";
        if (!c->byte_budget)
            snprintf(why, sizeof why,
                     ", BYTE_BUDGET auto: sized from the first sample for "
                     "SWAP_CAP=%u",
                     c->swap_cap);
        return wh_err_set(
            err, r == ENOSPC ? WH_E_NOSPACE : WH_E_SYS,
            "shm store '%s' needs %llu bytes (%d generation areas of BYTE_BUDGET=%llu%s) "
            "but /dev/shm has %llu free (%s); lower BYTE_BUDGET or SWAP_CAP, or "
            "enlarge /dev/shm (docker: --shm-size)",
            s->name, (unsigned long long)total, WH_SHM_AREAS, (unsigned long long)budget, why,
            avail, strerror(r));
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
    /* the locks start free: the segment is zero-filled.
     * Generation ids start from the wall clock in nanoseconds, so they keep
     * increasing even when the store is removed and created again (no store
     * seals faster than once a nanosecond). A spec store opens its first
     * generation at its first claim. */
    uint64_t g0 = wh_now_real_ns();
    h->spec = c->spec;
    h->run_seed = c->run_seed;
    h->spec_off = c->spec ? spec_off : 0;
    h->slots[0].gen = c->spec ? 0 : g0;
    h->write_gen = g0;
    wh__geometry(s, c->swap_cap, slot_bytes, index_off, c->spec ? spec_off : 0, data_off);
    __atomic_store_n(&h->magic, WH__SHM_MAGIC, __ATOMIC_RELEASE);
    return true;
}

/* A header string as printable ASCII, cut at its field's end: the
 * segment's bytes may be anything. */
void wh__shm_hdr_text(char *out, const char *in, size_t n) {
    size_t i = 0;
    for (; i + 1 < n && in[i]; i++)
        out[i] = (unsigned char)in[i] >= 0x20 && (unsigned char)in[i] < 0x7f ? in[i] : '?';
    out[i] = 0;
}

/* Whether two sources' names (scheme://HOSTS/DB (prefix P)) differ only
 * in HOSTS, which then go to *a and *b (lengths *al, *bl): one server may
 * be named two ways (localhost, 127.0.0.1), but a copy records the
 * spelling only, so it stays refused and the message says what differs.
 * False where they differ elsewhere, or a name was cut short. */
static bool wh__hosts_only(const char *x, const char *y, const char **a, int *al, const char **b,
                           int *bl) {
    const char *xs = strstr(x, "://"), *ys = strstr(y, "://");
    const char *xr = xs ? strchr(xs + 3, '/') : NULL, *yr = ys ? strchr(ys + 3, '/') : NULL;
    size_t xl = strlen(x), yl = strlen(y);
    if (!xr || !yr || xs - x != ys - y || strncmp(x, y, (size_t)(xs - x)) || strcmp(xr, yr) ||
        (xl >= 3 && !strcmp(x + xl - 3, "...")) || (yl >= 3 && !strcmp(y + yl - 3, "...")))
        return false;
    *a = xs + 3, *al = (int)(xr - xs - 3), *b = ys + 3, *bl = (int)(yr - ys - 3);
    return true;
}

/* A node-local copy serves only configs of the store it mirrors (one
 * LOCAL_CACHE name given to two stores must not hand one the other's
 * samples), a plain store is no copy, and a copy is no plain store (only
 * its relay writes it). want: the opener's source ("": a plain store),
 * have: the segment's. */
static bool wh__origin_ok(const char *shm, const char *want, const char *want_name,
                          const char *have, const char *have_name, wh_err_t *err) {
    if (!strcmp(want, have)) return true;
    if (!have[0])
        return wh_err_set(err, WH_E_SCHEMA,
                          "shm store '%s' (LOCAL_CACHE) records no source: it is a plain shm "
                          "store, not a relay's copy of %s; give LOCAL_CACHE a name of its "
                          "own (or auto), or remove that store with `wirehead-torch clean` and "
                          "a config whose STORE is shm://%s",
                          shm, want_name, shm);
    if (!want[0])
        return wh_err_set(err, WH_E_SCHEMA,
                          "shm store '%s' is this node's copy of %s, made by a relay for its "
                          "LOCAL_CACHE, not a store of its own: only that relay writes it; "
                          "give this config's STORE another name, or remove the copy once "
                          "nothing uses it (`wirehead-torch clean --local-only` with a config "
                          "of that store)",
                          shm, have_name);
    const char *hc, *hm;
    int hcl, hml;
    if (wh__hosts_only(have_name, want_name, &hc, &hcl, &hm, &hml))
        return wh_err_set(err, WH_E_SCHEMA,
                          "shm store '%s' (LOCAL_CACHE) is this node's copy of %s, not of %s "
                          "(this config's STORE): the two differ only in how the hosts are "
                          "written (%.*s in the copy, %.*s here); a copy records them as "
                          "written, so if both name one server write STORE's hosts as the "
                          "copy does, else give one config another LOCAL_CACHE name (or auto)",
                          shm, have_name, want_name, hcl, hc, hml, hm);
    return wh_err_set(err, WH_E_SCHEMA,
                      "shm store '%s' (LOCAL_CACHE) is this node's copy of %s, not of %s (this "
                      "config's STORE); give one of them another LOCAL_CACHE name (or auto), "
                      "or remove that copy once nothing uses it (`wirehead-torch clean "
                      "--local-only` with a config of that store)",
                      shm, have_name, want_name);
}

/* The segment's recorded source against the handle's (wh__origin_ok). */
static bool wh__hdr_origin_ok(const wh__shm_t *s, const wh__hdr_t *h, wh_err_t *err) {
    char id[WH_ORIGIN_ID_LEN], name[WH_ORIGIN_NAME_LEN];
    wh__shm_hdr_text(id, h->origin_id, sizeof id);
    wh__shm_hdr_text(name, h->origin_name, sizeof name);
    return wh__origin_ok(s->name, s->origin_id, s->origin_name, id, name, err);
}

/* A spec store (docs/reproducible.md) is opened only by configs of its
 * RUN_SEED, and a plain store only by configs without one. */
static bool wh__spec_attach_ok(const wh__shm_t *s, const wh__hdr_t *h, wh_err_t *err) {
    const wh_store_config_t *c = &s->base.cfg;
    bool spec = h->spec != 0;
    if (spec == c->spec && (!spec || h->run_seed == c->run_seed)) return true;
    const char *name = s->name;
    if (spec && c->spec)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store shm://%s was created with RUN_SEED=%llu; this config has "
                          "RUN_SEED=%llu (two runs never share a store: clean it or name another "
                          "STORE)",
                          name, (unsigned long long)h->run_seed, (unsigned long long)c->run_seed);
    if (spec)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store shm://%s was created with RUN_SEED=%llu (spec mode); this config "
                          "has no RUN_SEED: give it the same RUN_SEED, or clean the store",
                          name, (unsigned long long)h->run_seed);
    return wh_err_set(err, WH_E_SCHEMA,
                      "store shm://%s was created without RUN_SEED (freshest mode); this config "
                      "sets RUN_SEED=%llu: remove RUN_SEED, or clean the store (or name another "
                      "STORE) for a spec-mode run",
                      name, (unsigned long long)c->run_seed);
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
                              s->name);
        }
        /* another user's segment (or one others may write) could hand us
         * hostile bytes while we read: refuse it before mapping */
        if (sb.st_uid != geteuid() || (sb.st_mode & 0777) != 0600) {
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_INVALID,
                              "shm store '%s' belongs to uid %u with mode "
                              "%03o; a store must be owned by this user (uid %u) with mode "
                              "0600: remove it or use another name",
                              s->name, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 0777),
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
                              "build uses %d areas with reader pins: stop its users and remove it "
                              "with `wirehead-torch clean` or wt.clean(config)",
                              s->name, WH_SHM_AREAS);
        }
        /* a creator names the segment once it holds the header's pages
         * (wh__create_file): anything shorter, 0 bytes too, was cut */
        if ((uint64_t)sb.st_size < wh__page_up(sizeof(wh__hdr_t))) {
            if (h) wh_guard_munmap(h, sizeof(wh__hdr_t));
            return wh_err_set(err, WH_E_CORRUPT,
                              "shm store '%s' (%s) is %lld bytes, less than its header "
                              "(%llu): it was truncated; remove it with `wirehead-torch clean` or "
                              "wt.clean(config)",
                              s->name, s->files.segment, (long long)sb.st_size,
                              (unsigned long long)wh__page_up(sizeof(wh__hdr_t)));
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
                              "shm store '%s' is still being created by pid %lld", s->name,
                              (long long)creator);
        }
        wh_sleep_ms(1);
    }
    uint64_t index_off = 0, spec_off = 0, data_off = 0, total = 0;
    uint64_t slot_bytes = h->slot_bytes; /* read once: checked, then used */
    bool ok = true;
    uint64_t ns = wh__pidns();
    if (h->format_version != WH_FORMAT_VERSION || h->hdr_size != sizeof(wh__hdr_t)) {
        /* a header of another size: made by another build (older ones lack
         * the node-local copy's source) */
        ok = wh_err_set(err, WH_E_SCHEMA,
                        "shm store '%s' has format version %u with a %llu-byte header, this "
                        "build uses version %d with a %zu-byte one; stop its users and remove "
                        "it with `wirehead-torch clean` or wt.clean(config)",
                        s->name, h->format_version, (unsigned long long)h->hdr_size,
                        WH_FORMAT_VERSION, sizeof(wh__hdr_t));
    } else if (!wh__hdr_origin_ok(s, h, err)) {
        ok = false; /* before SAMPLE and the rest: whose copy it is says most */
    } else if (h->pidns && ns && h->pidns != ns) {
        ok = wh_err_set(err, WH_E_INVALID,
                        "shm store '%s' was created in another PID namespace "
                        "(another container?); every participant of an shm store must share "
                        "one (docker: --pid=host or a shared --pid), or use a MongoDB store",
                        s->name);
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
        ok =
            wh_err_set(err, WH_E_SCHEMA,
                       "shm store '%s' was created with SAMPLE [%s], the config's SAMPLE is "
                       "[%s]; use another store name or `wirehead-torch clean` or wt.clean(config)",
                       s->name, have, want);
    } else if (!c->no_create && c->byte_budget && h->slot_bytes != wh__page_up(c->byte_budget)) {
        ok = wh_err_set(
            err, WH_E_SCHEMA,
            "shm store '%s' was created with BYTE_BUDGET=%llu, "
            "config says %llu; the budget is fixed when the store is created: "
            "use the same value, or `wirehead-torch clean` (wt.clean(config)) and start again",
            s->name, (unsigned long long)h->slot_bytes, (unsigned long long)c->byte_budget);
    } else if (h->swap_cap != c->swap_cap) {
        ok = wh_err_set(
            err, WH_E_SCHEMA,
            "shm store '%s' was created with SWAP_CAP=%u, config "
            "says %u; use another store name or `wirehead-torch clean` or wt.clean(config)",
            s->name, h->swap_cap, c->swap_cap);
    } else if (!wh__spec_attach_ok(s, h, err)) {
        ok = false;
    } else if (!wh__layout(c->swap_cap, slot_bytes, c->spec, &index_off, &spec_off, &data_off,
                           &total, err) ||
               index_off != h->index_off || data_off != h->data_off || total != h->total_bytes ||
               (c->spec && spec_off != h->spec_off) || (uint64_t)sb.st_size < total) {
        ok =
            wh_err_set(err, WH_E_CORRUPT, "shm store '%s': header sizes are inconsistent", s->name);
    }
    wh_guard_munmap(h, sizeof(wh__hdr_t));
    if (!ok) return false;
    void *p = wh_guard_mmap(total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return wh_err_set(err, WH_E_SYS, "shm mmap: %s", strerror(errno));
    s->hdr = p;
    s->map_len = total;
    if (!wh__map_ro(s, fd, err)) return false;
    wh__geometry(s, c->swap_cap, slot_bytes, index_off, c->spec ? spec_off : 0, data_off);
    return true;
}

static void wh__unmap_partial(wh__shm_t *s);

/* Hands both mappings to a shared, counted owner (the handle's reference);
 * where this process maps the same segment already, its maps are used and
 * the new ones let go. */
static bool wh__share_maps(wh__shm_t *s, const struct stat *sb, wh_err_t *err) {
    pthread_once(&wh__maps_fork_once, wh__maps_fork_register);
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
    m->head.ops = s->base.ops;
    m->refs = 1;
    pthread_mutex_init(&m->memo_mu, NULL);
    m->rw = s->hdr;
    m->ro = s->ro;
    m->len = s->map_len;
    m->dev = sb->st_dev;
    m->ino = sb->st_ino;
    snprintf(m->name, sizeof m->name, "%s", s->name);
    snprintf(m->segment, sizeof m->segment, "%s", s->files.segment);
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
bool wh__shm_connect(wh__shm_t *s, uint64_t budget, wh_err_t *err) {
    const char *path = s->files.segment;
    for (int attempt = 0; attempt < 5; attempt++) {
        /* made exclusively (never through a planted symlink), mode 0600 */
        int fd = budget ? wh__create_file(s, path, err) : -EEXIST;
        if (fd >= 0) {
            if (!wh__create(s, fd, budget, err)) {
                wh__unmap_partial(s);
                close(fd);
                shm_unlink(wh__posix_name(s));
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
                return wh_err_set(err, WH_E_NOSTORE, "no shm store '%s' (%s)", s->name, path);
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
            struct stat mine, named;
            if (fstat(fd, &mine) == 0 && stat(path, &named) == 0 && mine.st_ino == named.st_ino)
                shm_unlink(wh__posix_name(s));
        }
        close(fd);
        if (!stale && e.code != WH_E_NOTFOUND) {
            if (err) *err = e;
            return false;
        }
    }
    if (s->fd < 0)
        return wh_err_set(err, WH_E_SYS, "shm store '%s': could not create or open it", s->name);
    struct stat sb;
    bool ok = fstat(s->fd, &sb) == 0 ||
              wh_err_set(err, WH_E_SYS, "shm store '%s': fstat: %s", s->name, strerror(errno));
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
    wh__shm_map_unref(s->map);
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
    struct stat named;
    if (stat(s->files.segment, &named) != 0) return errno == ENOENT;
    return named.st_dev != s->dev || named.st_ino != s->ino;
}

/* BYTE_BUDGET auto: room for SWAP_CAP samples of this one's encoded size,
 * a quarter more for samples that vary a little, and a MiB so tiny samples
 * still fit. So the segment (WH_SHM_AREAS areas) takes about
 * 5 x SWAP_CAP x sample. */
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
bool wh__shm_ready(wh__shm_t *s, const wh_array_t *arr, int n, wh_err_t *err) {
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
    if (wh__shm_connect(s, budget, err)) return true;
    if (err && err->code == WH_E_NOSTORE && !c->byte_budget && !c->no_create)
        wh_err_set(err, WH_E_NOSTORE,
                   "shm store '%s' does not exist yet: with BYTE_BUDGET auto "
                   "the first generator's first sample creates it (start a generator, or set "
                   "BYTE_BUDGET)",
                   s->name);
    return false;
}

/* The segment's size, re-checked before its bytes are touched: a segment
 * truncated under this process (damage, a tool) is an error, not SIGBUS. */
bool wh__shm_intact(const wh__shm_t *s, wh_err_t *err) {
    struct stat sb;
    if (s->fd < 0) return true;
    if (fstat(s->fd, &sb) != 0) return wh_err_set(err, WH_E_SYS, "shm fstat: %s", strerror(errno));
    /* a shrink seen by the guard stays an error even if the file grew back:
     * the mapping shows zero pages past the old end, not the file */
    if (sb.st_size < 0 || (uint64_t)sb.st_size < s->map_len || wh_guard_shrunk(s->hdr) ||
        wh_guard_shrunk(s->ro))
        return wh__shm_cut(err, s->name, s->files.segment, (long long)sb.st_size, s->map_len);
    return true;
}

bool wh__shm_cut(wh_err_t *err, const char *name, const char *segment, long long size, size_t len) {
    if (size < 0)
        return wh_err_set(err, WH_E_CORRUPT,
                          "shm store '%s' (%s) was truncated under this process; "
                          "remove it with `wirehead-torch clean` or wt.clean(config)",
                          name, segment);
    return wh_err_set(err, WH_E_CORRUPT,
                      "shm store '%s' (%s) was truncated to %lld of its %zu bytes "
                      "under this process; remove it with `wirehead-torch clean` or "
                      "wt.clean(config)",
                      name, segment, size, len);
}

const char *wh__shm_uri_name(const char *uri) {
    const char *name = strstr(uri, "://"); /* the scheme table matched "<scheme>://" */
    return name ? name + 3 : "";
}

bool wh__shm_init(wh__shm_t *s, const wh_store_config_t *cfg, wh_err_t *err) {
    const char *name = wh__shm_uri_name(cfg->uri);
    if (!wh_shm_files(name, &s->files, err)) return false;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->base.cfg = *cfg;
    s->pid = getpid();
    s->fd = -1;
    if (getrandom(&s->token, sizeof s->token, 0) != sizeof s->token)
        s->token = wh_now_real_ns() ^ ((uint64_t)s->pid << 32);
    s->token |= 1;
    if (cfg->origin_id) {
        if (!cfg->origin_id[0] || strlen(cfg->origin_id) >= sizeof s->origin_id)
            return wh_err_set(err, WH_E_INVALID, "origin_id must be 1..%d characters",
                              WH_ORIGIN_ID_LEN - 1);
        wh__shm_hdr_text(s->origin_id, cfg->origin_id, sizeof s->origin_id);
        wh__shm_hdr_text(s->origin_name, cfg->origin_name ? cfg->origin_name : "",
                         sizeof s->origin_name);
    }
    return true;
}

bool wh_shm_segment_bytes(uint32_t swap_cap, uint64_t byte_budget, bool spec, uint64_t *total,
                          wh_err_t *err) {
    uint64_t index_off, spec_off, data_off;
    return wh__layout(swap_cap, wh__page_up(byte_budget), spec, &index_off, &spec_off, &data_off,
                      total, err);
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
    l->slot_spec_label = offsetof(wh__slot_t, spec_label);
    l->slot_spec_state = offsetof(wh__slot_t, spec_state);
    l->slot_spec_check = offsetof(wh__slot_t, spec_check);
    l->claim_size = sizeof(wh__claim_t);
    l->hdr_spec_off = offsetof(wh__hdr_t, spec_off);
    l->hdr_size = sizeof(wh__hdr_t);
}

/* The source the segment open as fd records, when its header is a whole
 * one of this build (read, not mapped: a cut file is a short read). */
static bool wh__origin_of(int fd, char *id, char *name) {
    uint64_t magic = 0, hdr_size = 0;
    uint32_t version = 0;
    char rid[WH_ORIGIN_ID_LEN], rname[WH_ORIGIN_NAME_LEN];
    if (pread(fd, &magic, sizeof magic, offsetof(wh__hdr_t, magic)) != sizeof magic ||
        pread(fd, &version, sizeof version, offsetof(wh__hdr_t, format_version)) !=
            sizeof version ||
        pread(fd, &hdr_size, sizeof hdr_size, offsetof(wh__hdr_t, hdr_size)) != sizeof hdr_size ||
        magic != WH__SHM_MAGIC || version != WH_FORMAT_VERSION || hdr_size != sizeof(wh__hdr_t) ||
        pread(fd, rid, sizeof rid, offsetof(wh__hdr_t, origin_id)) != sizeof rid ||
        pread(fd, rname, sizeof rname, offsetof(wh__hdr_t, origin_name)) != sizeof rname)
        return false;
    wh__shm_hdr_text(id, rid, WH_ORIGIN_ID_LEN);
    wh__shm_hdr_text(name, rname, WH_ORIGIN_NAME_LEN);
    return true;
}

bool wh_shm_origin(const char *name, bool *found, char *id, char *oname, wh_err_t *err) {
    wh_shm_files_t f;
    *found = false;
    if (!wh_shm_files(name, &f, err)) return false;
    int fd = wh_shmfile_open(f.segment, 0, err);
    if (fd == -ENOENT) return true;
    if (fd < 0) return false;
    *found = wh__origin_of(fd, id, oname);
    close(fd);
    return *found || wh_err_set(err, WH_E_SCHEMA,
                                "shm store '%s' is not a whole segment of this build (being "
                                "made, cut, or another build's)",
                                name);
}

bool wh__shm_remove(const wh_store_config_t *cfg, const wh_shm_files_t *f, wh_err_t *err) {
    const char *name = wh__shm_uri_name(cfg->uri);
    char id[WH_ORIGIN_ID_LEN], oname[WH_ORIGIN_NAME_LEN];
    /* a copy is removed only as the copy of its store, a plain store only
     * as one: clean must not take a store for another's copy (or the
     * reverse). A segment that is not a whole one of this build (another
     * user's, being made, cut, an older layout) records nothing to check:
     * every opener refuses it, naming clean, so it goes as before. */
    wh_err_t e = {0};
    int fd = wh_shmfile_open(f->segment, 0, &e);
    if (fd >= 0) {
        struct stat mine, named;
        bool ok = true;
        if (wh__origin_of(fd, id, oname) &&
            !wh__origin_ok(name, cfg->origin_id ? cfg->origin_id : "",
                           cfg->origin_name ? cfg->origin_name : "", id, oname, err))
            ok = wh_err_prefix(err, "nothing removed");
        /* removed only while the name still names the segment checked */
        if (ok && (fstat(fd, &mine) != 0 || stat(f->segment, &named) != 0 ||
                   mine.st_dev != named.st_dev || mine.st_ino != named.st_ino))
            ok = wh_err_set(err, WH_E_SCHEMA, "shm store '%s' was replaced while being removed",
                            name);
        close(fd);
        if (!ok) return false;
    }
    if (unlink(f->segment) != 0 && errno != ENOENT)
        return wh_err_set(err, WH_E_SYS, "remove %s: %s", f->segment, strerror(errno));
    return true;
}
