/* Shared mappings and atomic control words of the DataLoader batch ring. */
#define _GNU_SOURCE
#include "wh_ring.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

bool wh_map_fd(wh_map_t *m, int fd, size_t size, bool populate, bool hugepage, wh_err_t *err) {
    m->base = NULL;
    m->size = 0;
    if (size == 0) return wh_err_set(err, WH_E_INVALID, "ring map: size 0");
    struct stat st;
    if (fstat(fd, &st) != 0)
        return wh_err_set(err, WH_E_SYS, "ring map: fstat: %s", strerror(errno));
    if (st.st_size < 0 || (uint64_t)st.st_size < (uint64_t)size)
        return wh_err_set(err, WH_E_INVALID, "ring map: file holds %lld bytes, %zu needed",
                          (long long)st.st_size, size);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0),
                   fd, 0);
    if (p == MAP_FAILED)
        return wh_err_set(err, WH_E_SYS, "ring map: mmap of %zu bytes: %s", size, strerror(errno));
    if (hugepage) madvise(p, size, MADV_HUGEPAGE); /* advice only: shmem huge pages may be off */
    m->base = p;
    m->size = size;
    return true;
}

void wh_map_close(wh_map_t *m) {
    if (m->base) munmap(m->base, m->size);
    m->base = NULL;
    m->size = 0;
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
