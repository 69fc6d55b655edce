/* The DataLoader workers' batch ring: slot files in /dev/shm shared by the
 * workers and the DataLoader's main process (wirehead_torch/_ring.py). */
#ifndef WH_RING_H
#define WH_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wh.h"

/* The DataLoader workers' batch ring (wirehead_torch/_ring.py) assembles
 * batches across processes: a worker and the DataLoader's main process map
 * the same files under /dev/shm, and slot ownership lives in 64-bit control
 * words that both sides change with atomic operations. Every ring file is
 * made and opened through wh_shmfile (ours, mode 0600, never a symlink) and
 * its size is checked again before the mapping is used. */
#define WH_MAP_PATH 256

typedef struct {
    void *base;
    size_t size;
    int fd; /* kept open: the size is re-checked before use (and holds a region's lock) */
    char path[WH_MAP_PATH]; /* for messages */
} wh_map_t;

/* How wh_map_file comes by the file. */
enum {
    WH_MAP_OPEN,   /* an existing file, checked: the DataLoader's main process */
    WH_MAP_CREATE, /* a new file, size bytes reserved: a worker's new slot */
    WH_MAP_REGION  /* a worker's control file: made, or an earlier worker's taken over */
};

/* Maps size bytes of the ring file at path, shared and writable; m owns the
 * mapping and the descriptor (wh_map_close). WH_MAP_REGION also takes the
 * file's lock (flock, exclusive, not waiting; released by wh_map_close or
 * wh_map_unlock): when another live process holds it, false with *busy set
 * (busy may be NULL otherwise). An existing file must be ours with mode
 * 0600 and hold size bytes (a region file with 0 bytes, whose maker has not
 * reserved it yet, is reserved here under the lock); anything else is
 * refused, never written. populate: fault every page in now (a slot mapped
 * once per process is then reused without faults). hugepage: advise
 * transparent huge pages. */
bool wh_map_file(wh_map_t *m, const char *path, size_t size, int how, bool populate, bool hugepage,
                 bool *busy, wh_err_t *err);
/* Releases a region's lock (the mapping stays). */
void wh_map_unlock(wh_map_t *m);
/* The file still holds every mapped byte and is still ours: call before the
 * mapping is touched (a file truncated under us is this error naming it,
 * not a SIGBUS). */
bool wh_map_intact(const wh_map_t *m, wh_err_t *err);
/* XXH3-64 of bytes [off, off + n) of the mapping, after wh_map_intact. */
bool wh_map_hash(const wh_map_t *m, size_t off, size_t n, uint64_t *out, wh_err_t *err);
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
