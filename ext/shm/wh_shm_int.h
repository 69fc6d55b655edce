/* Embedded backend: what its files share, each calling only those listed
 * before it (make lint checks that no two call each other round):
 *   wh_shm_seg.c     the segment: name, files, locks, create and attach,
 *                    layout and intact checks, the process's shared maps
 *   wh_pfile.c       the params side file (wh_pfile.h; calls only core/)
 *   wh_shm_put.c     areas and puts: holes, writers' reservations
 *   wh_shm_view.c    reads, store-backed views, reader pins (their pruning
 *                    too), a forked child's pins
 *   wh_shm_seal.c    the lease and the seal (the next area among unpinned ones)
 *   wh_shm_mirror.c  a relay's mirror of another store's generation
 *   wh_shm_status.c  status and readers' heartbeats
 *   wh_shm_spec.c    spec mode (docs/reproducible.md): areas labelled with
 *                    their spec generation, the window, claims, locate
 *   wh_shm_spec_put.c  spec mode's put at a position, its seal
 *   wh_shm.c         open, clean, destroy and the operation table over them
 * Internal: included only by those files. */
#ifndef WH_SHM_INT_H
#define WH_SHM_INT_H

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

#include "wh_fault.h"
#include "wh_guard.h"
#include "wh_pfile.h"
#include "wh_shm.h"
#include "wh_shmfile.h"

#define WH__SHM_MAGIC 0x324d485344414857ull    /* "WHADSHM2": WH_SHM_AREAS slots, reader pins */
#define WH__SHM_MAGIC_V1 0x314d485344414857ull /* "WHADSHM1": 3 slots, older builds */
#define WH_SHM_AREAS 4
#define WH__MAX_PINNERS 64 /* reader processes pinning one slot at a time */
#define WH__MAX_WRITERS 256
#define WH__HIST 16
#define WH__OPEN_WAIT_MS 5000

#define WH__MAX_HOLES 64

/* A lock in the segment: the holder's pid, 0 when free (wh__shm_lock).
 * Not a pthread mutex: glibc aborts the process on some garbage in a
 * robust mutex (found by fuzz_segment), and a segment's bytes may be
 * hostile. */
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
    /* spec mode (wh_shm_spec.c): the spec generation this area holds, + 1
     * (0: none), and its state; meaningful only while gen is not 0 */
    uint64_t spec_label;
    uint32_t spec_state;  /* WH__SPEC_OPEN or WH__SPEC_SEALED */
    uint32_t spec_failed; /* position + 1 of an index that failed every attempt (0: none) */
    uint64_t spec_pv;     /* the params version in force for it */
    uint32_t spec_pv_len; /* bytes of that document's copy in the spec region */
    uint32_t spec_pad;
    uint64_t spec_pv_sum;      /* XXH3 of that copy, seeded with spec_pv */
    uint64_t spec_check;       /* ties spec_label to gen: a label failing it is no label */
    char spec_why[WH_ERR_LEN]; /* the failure, in words */
} wh__slot_t;

#define WH__SPEC_OPEN 1u
#define WH__SPEC_SEALED 2u

/* One position's claim in the spec region (per area, SWAP_CAP of them). */
typedef struct {
    int32_t pid;        /* the last claimer (0: never claimed) */
    uint32_t attempts;  /* claims so far */
    uint64_t token;     /* the last claim's */
    uint64_t expiry_ns; /* CLOCK_REALTIME: the lease's end; renewals push it */
    uint32_t state;     /* WH__CLAIM_* */
    uint32_t lease_ms;  /* the claimer's CLAIM_LEASE: bounds how far ahead expiry may be */
} wh__claim_t;

#define WH__CLAIM_FREE 0u /* never claimed, or given back after fn failed */
#define WH__CLAIM_HELD 1u
#define WH__CLAIM_DONE 2u /* put (the index entry's size is what counts) */

typedef struct {
    uint64_t off, size;
} wh__entry_t;

/* A reader handle's heartbeat; token 0: a free entry. Read by `status`
 * only: a torn or forged entry shows wrong figures, never more. */
typedef struct {
    uint64_t token; /* atomic: claimed by compare-and-swap */
    int64_t pid;
    uint64_t gen, reads, gen_reads, start_ns, beat_ns;
    uint64_t need; /* spec mode: the lowest spec generation it still needs, + 1 (0: none) */
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
    wh__slot_t slots[WH_SHM_AREAS];
    wh__beat_t readers[WH__MAX_READERS];
    /* a node-local copy's source (wh_store_config_t), set at creation:
     * "" in a plain store */
    char origin_id[WH_ORIGIN_ID_LEN];
    char origin_name[WH_ORIGIN_NAME_LEN];
    uint64_t last_put_ns; /* atomic: CLOCK_REALTIME of the newest put, accepted or not */
    /* spec mode (docs/reproducible.md), set at creation; 0 in other stores */
    uint32_t spec;
    uint32_t spec_pad;
    uint64_t run_seed;
    uint64_t spec_off;    /* the spec region: claims, then params copies, per area */
    uint64_t spec_floor;  /* atomic: the lowest spec generation kept when no reader says */
    uint64_t spec_dups;   /* atomic: spec puts dropped, another of the index won */
    uint64_t spec_nondet; /* atomic: those whose bytes differed */
} wh__hdr_t;

/* The segment's mappings, shared by the handle and every live view, so a
 * view outlives the handle that made it. */
typedef struct wh__map {
    wh_store_map_head_t head; /* the handle's ops, for wh_store_map_unref */
    uint64_t refs;            /* atomic */
    void *rw;                 /* the store's own read-write mapping */
    const void *ro;           /* the same segment mapped read-only: views point here */
    size_t len;
    /* the segment's file: handles of one process on one segment share one
     * map (one mapping to register with a GPU runtime, not one per handle) */
    dev_t dev;
    ino_t ino;
    char name[WH_SHM_NAME_MAX + 1]; /* its store's, for messages */
    char segment[WH_SHM_PATH_MAX];  /* its file's path, for messages */
    struct wh__map *next;
    /* the GPU path's positions verified in this process, per area and for
     * the generation it held then (docs/gpu.md, "Checks") */
    pthread_mutex_t memo_mu;
    uint64_t memo_gen[WH_SHM_AREAS];
    uint8_t *memo[WH_SHM_AREAS];
} wh__map_t;

typedef struct {
    wh_store_t base;
    char name[WH_SHM_NAME_MAX + 1]; /* the store's name, checked */
    wh_shm_files_t files;           /* its files' paths */
    wh__hdr_t *hdr;
    const char *ro; /* read-only mapping of the segment (views) */
    wh__map_t *map;
    size_t map_len;
    uint64_t token;
    uint64_t puts;
    pid_t pid;
    int fd; /* kept open: the segment's size is re-checked before its bytes are read */
    /* hdr NULL: not attached (BYTE_BUDGET auto and no segment yet, or the
     * segment was removed); wh__shm_ready attaches, and creates on a put */
    uint64_t checked_ns; /* last check that the name still names our segment */
    dev_t dev;
    ino_t ino;
    bool created; /* this handle created the segment it is attached to */
    /* geometry, checked once at attach and never re-read from shared memory */
    uint32_t swap_cap;
    uint64_t slot_bytes, index_off, data_off;
    uint64_t mirror_off, mirror_size; /* a relay's reservation for the next position */
    bool dma_views;                   /* views held for a device copy (wh_store_set_dma_views) */
    wh_pfile_t *pfile;                /* the params side file */
    uint64_t spec_off;                /* the spec region (0: not a spec store) */
    /* spec mode before the segment exists (BYTE_BUDGET auto): index 0's
     * failed attempts, which no segment can record yet */
    uint32_t first_fails;
    char first_why[WH_ERR_LEN];
    /* the config's origin (a node-local copy's source), kept for every attach */
    char origin_id[WH_ORIGIN_ID_LEN];
    char origin_name[WH_ORIGIN_NAME_LEN];
} wh__shm_t;

static inline uint64_t wh__ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* `status` tells a store whose generators stopped by this time. */
static inline void wh__put_seen(wh__hdr_t *h) {
    __atomic_store_n(&h->last_put_ns, wh_now_real_ns(), __ATOMIC_RELAXED);
}
static inline void wh__st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* Pin drops run from a view's deleter, which has no store at hand. */
#define WH__PIN_LOCK_WAIT_S 10.0

static inline bool wh__pid_alive(int64_t pid) {
    if (pid <= 0 || pid > INT32_MAX) return false; /* no such pid: not 1 after a cast */
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

static inline wh__entry_t *wh__index(const wh__shm_t *s, int slot) {
    return (wh__entry_t *)((char *)s->hdr + s->index_off) + (size_t)slot * s->swap_cap;
}

static inline char *wh__data(const wh__shm_t *s, int slot) {
    return (char *)s->hdr + s->data_off + (size_t)slot * s->slot_bytes;
}

/* spec mode: an area's claims, and its copy of the params document */
static inline wh__claim_t *wh__claims(const wh__shm_t *s, int slot) {
    return (wh__claim_t *)((char *)s->hdr + s->spec_off) + (size_t)slot * s->swap_cap;
}
static inline char *wh__spec_params_copy(const wh__shm_t *s, int slot) {
    return (char *)s->hdr + s->spec_off + (size_t)WH_SHM_AREAS * s->swap_cap * sizeof(wh__claim_t) +
           (size_t)slot * WH_PARAMS_MAX;
}
/* bytes of the spec region of a store of swap_cap (0 where not spec) */
static inline uint64_t wh__spec_bytes(uint32_t swap_cap, bool spec) {
    return spec
               ? (uint64_t)WH_SHM_AREAS * ((uint64_t)swap_cap * sizeof(wh__claim_t) + WH_PARAMS_MAX)
               : 0;
}

/* wh_shm_seg.c */
bool wh__shm_lock(wh__lock_t *l, double wait_s, wh_err_t *err);
void wh__shm_unlock(wh__lock_t *l);
int wh__shm_slot_of(const wh__hdr_t *h, uint64_t gen);
void wh__shm_hdr_text(char *out, const char *in, size_t n);
bool wh__shm_connect(wh__shm_t *s, uint64_t budget, wh_err_t *err);
bool wh__shm_ready(wh__shm_t *s, const wh_array_t *arr, int n, wh_err_t *err);
bool wh__shm_intact(const wh__shm_t *s, wh_err_t *err);
/* The error of a segment cut under this process: size -1 when unknown. */
bool wh__shm_cut(wh_err_t *err, const char *name, const char *segment, long long size, size_t len);
void wh__shm_map_unref(wh__map_t *m);
/* the store name in a URI: what follows its scheme's "://" */
const char *wh__shm_uri_name(const char *uri);
/* a handle's name, files, origin and token from its config (open) */
bool wh__shm_init(wh__shm_t *s, const wh_store_config_t *cfg, wh_err_t *err);
/* removes f's segment (clean) unless it records a source other than
 * cfg's: a copy goes only as its store's copy, a plain store never as one */
bool wh__shm_remove(const wh_store_config_t *cfg, const wh_shm_files_t *f, wh_err_t *err);
/* wh_shm_put.c */
void wh__shm_prune_writers(wh__slot_t *sl);
/* an area's bookkeeping checked before a put trusts it (area lock held) */
bool wh__shm_slot_sane(const wh__shm_t *s, const wh__slot_t *sl, int slot, wh_err_t *err);
/* a put's reservation in an area (area lock held): a writer entry, its
 * bytes (first fit among holes, else the area's end), its end */
int wh__shm_take_writer(wh__slot_t *sl, pid_t pid);
bool wh__shm_reserve(wh__slot_t *sl, uint64_t cap, uint64_t size, uint64_t *off);
void wh__shm_end_writer(wh__slot_t *sl, int i, bool keep_bytes);
bool wh__shm_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                 wh_put_status_t *ps, uint64_t *gen_out, wh_err_t *err);
/* wh_shm_view.c */
bool wh__shm_current(wh_store_t *st, uint64_t *gen, wh_err_t *err);
bool wh__shm_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                  wh_sample_meta_t *meta, wh_err_t *err);
void wh__shm_prune_pins(wh__slot_t *sl);
bool wh__shm_read_held(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                       wh_sample_meta_t *meta, wh_err_t *err);
bool wh__shm_view(wh_store_t *st, uint64_t gen, uint32_t pos, const uint64_t *known, wh_buf_t **out,
                  wh_sample_meta_t *meta, wh_err_t *err);
void wh__shm_set_dma_views(wh_store_t *st, bool on);
void *wh__shm_view_map(const wh_buf_t *view, const void **base, size_t *len);
void wh__shm_map_release(void *map);
bool wh__shm_map_in_use(void *map);
bool wh__shm_view_intact(const wh_buf_t *view, wh_err_t *err);
/* wh_shm_seal.c */
bool wh__shm_lease_forged(const wh__hdr_t *h, uint64_t now);
bool wh__shm_lead(wh_store_t *st, bool *leader, wh_err_t *err);
bool wh__shm_resign(wh_store_t *st, wh_err_t *err);
bool wh__shm_take_next_slot(wh__hdr_t *h, double wait_s, uint64_t w, wh_seal_info_t *info, int *out,
                            wh_err_t *err);
bool wh__shm_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err);
/* wh_shm_mirror.c (wh_store_mirror_begin and the rest, wh_store.h) */
bool wh__shm_mirror_begin(wh_store_t *st, uint64_t gen, uint64_t budget, wh_err_t *err);
bool wh__shm_mirror_reserve(wh_store_t *st, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                            wh_err_t *err);
bool wh__shm_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err);
/* wh_shm_spec.c (spec mode, docs/reproducible.md) */
/* area sl holds gen, open or sealed for c's spec generation and params */
bool wh__shm_spec_holds(const wh__shm_t *s, const wh__slot_t *sl, uint64_t gen,
                        const wh_claim_t *c);
/* seals area slot (holding gen) once every position is put */
bool wh__shm_spec_seal(wh__shm_t *s, int slot, uint64_t gen, bool *sealed, wh_err_t *err);
/* the generation a put of c goes to (0: none now; c->gen 0: the store's
 * first claim, made before the store existed) */
bool wh__shm_spec_open_for(wh__shm_t *s, const wh_claim_t *c, uint64_t *gen, wh_err_t *err);
bool wh__shm_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                        wh_claim_status_t *status, wh_err_t *err);
bool wh__shm_spec_renew(wh_store_t *st, const wh_claim_t *c, double lease_s, bool *mine,
                        wh_err_t *err);
bool wh__shm_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts, const char *why,
                       bool *failed, wh_err_t *err);
bool wh__shm_spec_locate(wh_store_t *st, uint64_t spec_gen, uint64_t *gen, wh_err_t *err);
bool wh__shm_spec_need(wh_store_t *st, uint64_t spec_gen, wh_err_t *err);
bool wh__shm_spec_params(wh_store_t *st, const wh_claim_t *c, char **doc, size_t *len,
                         wh_err_t *err);
bool wh__shm_spec_status(wh_store_t *st, wh_spec_status_t *out, wh_err_t *err);
bool wh__shm_spec_seal_full(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err);
/* wh_shm_spec_put.c */
bool wh__shm_spec_put(wh_store_t *st, const wh_claim_t *c, const wh_array_t *arr, int n,
                      wh_spec_put_t *status, bool *sealed, wh_err_t *err);
/* wh_shm_status.c */
bool wh__shm_status(wh_store_t *st, wh_status_t *o, wh_err_t *err);
bool wh__shm_beat(wh_store_t *st, const wh_reader_beat_t *b, wh_err_t *err);
void wh__shm_beat_drop(wh__shm_t *s);

#endif
