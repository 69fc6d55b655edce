/* The DataLoader workers' batch ring: slot files in /dev/shm shared by the
 * workers and the DataLoader's main process, the protocol that hands a slot
 * between them, and a worker's fill of a slot (bound in wh_py_ring.c;
 * wirehead_torch/_ring.py keeps the DataLoader glue). */
#ifndef WH_RING_H
#define WH_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wh.h"
#include "wh_batch.h"

/* The ring assembles batches across processes: a worker and the DataLoader's main process map
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

/* ---- the ring protocol ----
 *
 * Files, per (main process, dataset, worker k), mode 0600:
 *   <region>               control words; the live worker holds its flock
 *   <region>.s<j>.v<v>     slot j's bytes (a new version v when it grows)
 * Control words per slot: owner pid (0: free), fill sequence, capacity,
 * version. A worker takes free slots, fills them, seals them (below) and
 * sends a handle (slot, version, sequence, its pid, the seal's XXH3); the
 * main process claims the slot (owner worker -> main, atomically, only
 * while version and sequence still match), checks the seal, and hands it
 * back (owner main -> 0) when the last tensor over it is gone. The worker
 * that takes a region reclaims every slot the main process does not hold:
 * a handle of its dead predecessor is then refused.
 *
 * A slot's seal, at WH_ALIGN_UP(size) after the batch's size bytes: a
 * header of 8 uint64 (WH_RING_SEAL_MAGIC, the worker's pid, sequence,
 * version, size, the number of checks n, 0, 0) and the row table, n
 * wh_ring_check_t: each row of each field with its stored XXH3 (the
 * checksum its copy was checked against as it was written), the last one
 * over the batch's extras. The handle carries the XXH3 of header and table,
 * so a claim knows the slot is the one the worker filled without reading
 * its rows again (WH_RING_CHECK_SLOT); WH_RING_CHECK_ROWS re-hashes every
 * row against the table as well. */
#define WH_RING_WORDS 4
/* ring_slots' bound (Python reads it as _C.RING_SLOTS_MAX) */
#define WH_RING_SLOTS_MAX (1u << 16)
enum {
    WH_RING_OWNER,
    WH_RING_SEQ,
    WH_RING_CAP,
    WH_RING_VER
};

#define WH_RING_SEAL_MAGIC 0x314c414553524857ull /* "WHRSEAL1" */
#define WH_RING_SEAL_WORDS 8
/* What a claim checks. */
enum {
    WH_RING_CHECK_NONE, /* the control words only (VERIFY_READS off) */
    WH_RING_CHECK_SLOT, /* and the seal, and the extras' XXH3: no pass over the rows */
    WH_RING_CHECK_ROWS  /* and every row's XXH3 against the sealed table */
};

typedef struct wh_ring wh_ring_t;

/* One row of one field as the worker left it: what a claim checks. */
typedef struct {
    uint64_t off, n, hash;
} wh_ring_check_t;

/* Opens the region at path with nslots slots; label names the worker in
 * messages. worker: the control file is made or taken over under its lock
 * (*busy when another live process holds it) and every slot not held by
 * main_pid is reclaimed; else (the main process) the existing file is
 * opened. Owned by the caller: wh_ring_close (batches still out keep what
 * they need). */
wh_ring_t *wh_ring_open(const char *path, const char *label, uint32_t nslots, bool worker,
                        int64_t main_pid, bool *busy, wh_err_t *err);
void wh_ring_close(wh_ring_t *r);
/* A DataLoader worker ends with the process iterating its DataLoader
 * (main_pid): the kernel signals it when its parent dies
 * (PR_SET_PDEATHSIG, Linux, a real-time signal of its own), and the
 * handler then removes this user's regular files in dir whose names start
 * with prefix (the dead main process's ring files) and ends the worker by
 * SIGTERM. parent: the worker's parent while main_pid lives (fork, spawn;
 * the signal sent when only a thread of it exits is ignored), 0: a
 * forkserver's child (its server ends after the main process). A main
 * process that died before this call ends the worker at once. SIGTERM
 * from another process than main_pid while it lives is ignored (the
 * worker ends with it, its files removed); from main_pid, or after it
 * died, SIGTERM ends the worker. Once per process; false on other
 * systems or a failed call. */
bool wh_ring_exit_with(int64_t main_pid, int64_t parent, const char *dir, const char *prefix,
                       wh_err_t *err);
/* The main process removes its ring files (this user's regular files in
 * dir named prefix*) when SIGTERM ends it: a handler in place of the
 * default, then SIGTERM ends the process as the default would. Only where
 * SIGTERM has its default disposition (*installed false otherwise: a
 * handler of the program's stays). Once per process; Linux only. */
bool wh_ring_term_removes(const char *dir, const char *prefix, bool *installed, wh_err_t *err);
/* Releases the region's lock (a worker's ring stays usable). */
void wh_ring_unlock(wh_ring_t *r);

/* Worker: takes a free slot of at least nbytes (one too small is grown: a
 * new, page-rounded file version made first, so a failure, a full /dev/shm
 * among them as WH_E_NOSPACE, leaves the slot as it was), waiting up to
 * wait_s while every slot is held; *slot -1 when none came free. *data:
 * the slot's memory. Threads of one process take slots one at a time. */
bool wh_ring_acquire(wh_ring_t *r, uint64_t nbytes, double wait_s, int *slot, void **data,
                     wh_err_t *err);
/* Bytes a slot needs for a batch of size bytes sealed with n checks. */
uint64_t wh_ring_bytes(uint64_t size, size_t n);
/* Worker: writes slot j's seal for a batch of size bytes with checks (the
 * last over the extras); *sum: the XXH3 of the seal, for the handle. The
 * slot was taken with wh_ring_bytes(size, n) bytes. */
bool wh_ring_seal(wh_ring_t *r, int j, uint64_t size, const wh_ring_check_t *checks, size_t n,
                  uint64_t *sum, wh_err_t *err);
/* Worker: slot j back without sending it. */
void wh_ring_give_back(wh_ring_t *r, int j);
/* Worker: slot j's version and fill sequence, for its handle. */
bool wh_ring_stamp(wh_ring_t *r, int j, int64_t *ver, int64_t *seq, wh_err_t *err);
/* XXH3-64 of bytes [off, off + n) of slot j, its file checked first. */
bool wh_ring_hash(wh_ring_t *r, int j, uint64_t off, uint64_t n, uint64_t *out, wh_err_t *err);
/* Control word k of slot j. */
bool wh_ring_word(wh_ring_t *r, int j, int k, int64_t *out, wh_err_t *err);

/* Main process: claims slot j of a handle (version ver, sequence seq,
 * filled by worker pid wpid, its seal's XXH3 sum) and checks it as check
 * says (WH_RING_CHECK_*; rows: the checks the seal must hold, the rows of
 * every field and one for the extras); *out: the slot's first size bytes,
 * a buffer whose last reference hands the slot back. WH_E_GONE: reclaimed
 * before the handle arrived; WH_E_CORRUPT: the seal or the bytes fail
 * their check (the error names the file); WH_E_TOOBIG: the batch does not
 * fit the slot. On an error the slot goes back to its worker. */
bool wh_ring_claim(wh_ring_t *r, int j, int64_t ver, int64_t seq, int64_t wpid, uint64_t size,
                   uint64_t sum, size_t rows, int check, wh_buf_t **out, wh_err_t *err);
/* In-process iteration: slot j, already taken by this process, as such a
 * buffer. */
bool wh_ring_local(wh_ring_t *r, int j, uint64_t size, wh_buf_t **out, wh_err_t *err);
/* The mapping of the slot file under held (a buffer from wh_ring_claim or
 * wh_ring_local): a new reference to a buffer over the whole mapping, which
 * stays mapped while referenced (a slot grown since keeps its old mapping
 * until then); NULL when held is no slot's. A GPU stage registers it once
 * and copies from it directly. */
wh_buf_t *wh_ring_slot_map(wh_buf_t *held);
/* Called after every copy out of held (as above), before the copy is
 * handed on: false (an error naming the slot file) when the file was cut
 * so that the copy read zero pages. True for a buffer that is no slot's. */
bool wh_ring_held_intact(const wh_buf_t *held, wh_err_t *err);

/* Worker: reads a batch (wh_batch_fill; rq->mem is set here) into a slot of
 * r, taken once the first sample gives the batch's size, waiting up to
 * wait_s for one, and seals it (*seal: the sum for the handle; rq->sums,
 * if set, gets the rows' stored XXH3); with no slot free (or r NULL) into
 * heap memory, *heap (the caller's reference). *slot: the slot, -1 for
 * heap memory. On an error nothing is held; *ring_failed tells the ring's
 * errors (its files) from the read's. rq->direct_min > 0 with a ring (the
 * hand-over of positions, an shm store): fields whose rows are at least
 * that size stay in the store (b->direct), each sample viewed and checked
 * once a generation and let go before this returns; the slot holds the
 * rest (b->hsize bytes, sealed over them), and heap memory gets the batch
 * gathered whole. */
bool wh_ring_fill(wh_ring_t *r, wh_batch_fill_t *rq, uint64_t gen, double wait_s, int *slot,
                  wh_buf_t **heap, wh_batch_t *b, void **data, uint64_t *seal,
                  wh_batch_stats_t *stats, bool *ring_failed, wh_err_t *err);

#endif
