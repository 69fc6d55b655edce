/* wirehead_torch: memory of the DataLoader batch ring (wirehead_torch/_ring.py).
 * A worker and the DataLoader's main process map the same files under
 * /dev/shm; slot ownership lives in 64-bit control words that both sides
 * change with atomic operations. Plain C; no Python here. */
#ifndef WH_RING_H
#define WH_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wh.h"

typedef struct {
    void *base;
    size_t size;
} wh_map_t;

/* Maps size bytes of the open file fd, shared. The file must hold at least
 * size bytes (checked, so a short file is an error, not SIGBUS). populate:
 * fault every page in now (a slot mapped once per process is then reused
 * without faults). hugepage: advise transparent huge pages. */
bool wh_map_fd(wh_map_t *m, int fd, size_t size, bool populate, bool hugepage, wh_err_t *err);
void wh_map_close(wh_map_t *m);

/* Control words: index i must be < size / 8 (callers check). Sequentially
 * consistent, so a slot's fill sequence is seen before its owner changes. */
int64_t wh_word_load(const wh_map_t *m, size_t i);
void wh_word_store(const wh_map_t *m, size_t i, int64_t v);
/* Sets word i to desired if it holds expect; true if it did. */
bool wh_word_cas(const wh_map_t *m, size_t i, int64_t expect, int64_t desired);
/* Adds d to word i; returns the new value. */
int64_t wh_word_add(const wh_map_t *m, size_t i, int64_t d);

#endif
