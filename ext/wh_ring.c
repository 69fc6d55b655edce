/* The DataLoader workers' batch ring (wh_ring.h): shared maps of the ring
 * files and their control words. */
#define _GNU_SOURCE
#include "wh_ring.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h> /* XXH3 with the widest SIMD the CPU has, chosen at run time */
#endif

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
    void *p =
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
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
    if (!m->base) return wh_err_set(err, WH_E_INVALID, "ring file %s: not mapped", m->path);
    return wh_shmfile_check(m->fd, m->path, m->size, NULL, err);
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
    if (m->base) munmap(m->base, m->size);
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
