/* The embedded backend's extras beside its operation table: the rule of a
 * store's name and the /dev/shm files a name makes (Python's
 * _C.shm_check_name and _C.shm_files), the source a segment records
 * (_C.shm_origin), the segment's size (_C.SHM_AREAS,
 * _C.shm_segment_bytes), and the segment's layout for tests and fuzzers
 * that forge damage. Everything else the store reaches through wh_shm_ops. */
#ifndef WH_SHM_H
#define WH_SHM_H

#include "wh_backend.h"

/* Generation areas of a segment: write, read, and two more a seal chooses
 * among unpinned ones (docs/design.md, "Bounded storage"). */
#define WH_SHM_AREAS 4
/* A store name's length: 1..WH_SHM_NAME_MAX of [A-Za-z0-9._-] */
#define WH_SHM_NAME_MAX 200

/* The shm:// line of the scheme table (wh_scheme.c). */
extern const wh_store_ops_t wh_shm_ops;

/* The name rule: false with WH_E_INVALID saying it. */
bool wh_shm_check_name(const char *name, wh_err_t *err);

/* The files a store of this name makes in /dev/shm (wh_shmfile.h): its
 * segment, its params file, and the lock and figures of the relay that
 * fills it when it is a LOCAL_CACHE copy. */
#define WH_SHM_PATH_MAX 256
typedef struct {
    char segment[WH_SHM_PATH_MAX];
    char params[WH_SHM_PATH_MAX];
    char relay_lock[WH_SHM_PATH_MAX];
    char relay_state[WH_SHM_PATH_MAX];
} wh_shm_files_t;
bool wh_shm_files(const char *name, wh_shm_files_t *out, wh_err_t *err);

/* The source the segment of shm store name records: *found false when
 * there is none; id ("" in a plain store, WH_ORIGIN_ID_LEN bytes) and
 * oname (WH_ORIGIN_NAME_LEN) when there is. False with err when the file
 * is refused or is no whole segment of this build (_C.shm_origin). */
bool wh_shm_origin(const char *name, bool *found, char *id, char *oname, wh_err_t *err);

/* Bytes of /dev/shm a segment reserves: the header, an index of SWAP_CAP
 * entries per area, a spec store's claims and params copies (spec mode),
 * and WH_SHM_AREAS areas of byte_budget (each rounded up to whole pages).
 * False (WH_E_INVALID) when that overflows. */
bool wh_shm_segment_bytes(uint32_t swap_cap, uint64_t byte_budget, bool spec, uint64_t *total,
                          wh_err_t *err);

/* Byte offsets inside a segment, for tests and fuzzers that forge damage
 * (the layout is private to the shm files). */
typedef struct {
    size_t hdr_lock, leader_pid, leader_token, lease_expiry_ns, lease_ns;
    size_t slots, slot_size, slot_lock, slot_gen, slot_used, slot_count, slot_nholes, slot_holes;
    /* spec mode: an area's label, state and check word; a claim entry's
     * size; where the header records the spec region's offset */
    size_t slot_spec_label, slot_spec_state, slot_spec_check, claim_size, hdr_spec_off;
    size_t hdr_size; /* the header, before page rounding (the /dev/shm a store reserves) */
} wh_shm_layout_t;
void wh_shm_layout(wh_shm_layout_t *l);

#endif
