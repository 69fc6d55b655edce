/* Private to the store: what the backends (wh_shm.c, wh_mongo*.c) and the
 * dispatch in wh_store.c share. Callers use wh_store.h; only tests and
 * fuzzers that forge segment damage include this for the shm layout. */
#ifndef WH_BACKEND_H
#define WH_BACKEND_H

#include "wh_store.h"

/* What one handle has read, for its heartbeat; token names the handle. */
typedef struct {
    uint64_t token;
    int64_t pid;
    uint64_t gen, reads, gen_reads;
    uint64_t start_ns, beat_ns; /* CLOCK_REALTIME */
} wh_reader_beat_t;

typedef struct {
    const char *scheme;
    bool (*put)(wh_store_t *, const wh_array_t *arr, int n, unsigned wait_ms, wh_put_status_t *st,
                uint64_t *gen, wh_err_t *);
    bool (*lead)(wh_store_t *, bool *leader, wh_err_t *);
    bool (*resign)(wh_store_t *, wh_err_t *);
    bool (*seal)(wh_store_t *, bool *sealed, wh_seal_info_t *info, wh_err_t *);
    bool (*current)(wh_store_t *, uint64_t *gen, wh_err_t *);
    bool (*read)(wh_store_t *, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                 wh_sample_meta_t *meta, wh_err_t *);
    bool (*status)(wh_store_t *, wh_status_t *, wh_err_t *);
    /* store-backed view; NULL where the backend has none (mongo). known
     * (may be NULL): per field, a stored checksum another process of this
     * reader verified the bytes against (wh_store_view_known) */
    bool (*view)(wh_store_t *, uint64_t gen, uint32_t pos, const uint64_t *known, wh_buf_t **out,
                 wh_sample_meta_t *meta, wh_err_t *);
    /* read holding gen for the copy (a transient pin), so a slow copy
     * cannot lose the race with reclamation; NULL where the backend has
     * no pins (mongo) */
    bool (*read_held)(wh_store_t *, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                      wh_sample_meta_t *meta, wh_err_t *);
    /* a reader's heartbeat (see wh_reader_beat_t); NULL: none kept */
    bool (*beat)(wh_store_t *, const wh_reader_beat_t *, wh_err_t *);
    double beat_every_s;
    /* parameters (wh_store.h): set, get, the version cheaply */
    bool (*params_set)(wh_store_t *, const char *doc, size_t len, uint64_t *version, wh_err_t *);
    bool (*params_get)(wh_store_t *, uint64_t *version, char **doc, size_t *len, wh_err_t *);
    bool (*params_version)(wh_store_t *, uint64_t *version, wh_err_t *);
    /* a generation's params versions in one pass; NULL: read each sample's
     * header through read */
    bool (*gen_params)(wh_store_t *, uint64_t gen, wh_gen_params_t *out, wh_err_t *);
    void (*destroy)(wh_store_t *);
} wh_store_ops_t;

/* Adds a reader's beat to a status (same pid and host: one reader, its
 * handles' reads summed); beats older than WH_READER_LIVE_S are left out. */
void wh_status_add_reader(wh_status_t *o, const wh_reader_beat_t *b, const char *host,
                          uint64_t now_ns);

/* Every backend's handle starts with this. */
struct wh_store {
    const wh_store_ops_t *ops;
    wh_store_config_t cfg;
    char *uri;             /* owned copy of cfg.uri */
    int pid;               /* process that opened it: the fork guard */
    wh_reader_beat_t beat; /* this handle's reads (the read policy counts them) */
    uint64_t put_params;   /* params version later puts record */
    uint64_t last_params;  /* params version of the sample last read */
    uint64_t min_params;   /* readers: generations under params >= this only */
    uint64_t pv_gen;       /* the last generation checked against min_params */
    bool pv_gen_ok;
    uint64_t pv_ok_gen; /* newest generation found to qualify */
    uint64_t gp_gen;    /* wh_store_gen_params' last answer, for gp_gen */
    wh_gen_params_t gp;
    struct wh_pfile *pfile; /* shm: the params side file, mapped (wh_pfile.c) */
    bool dma_views;         /* views held for a device copy (wh_store_set_dma_views) */
};

/* The protocol's shared error texts: every backend reports these cases
 * with the same code and words. */
static inline bool wh_store_err_gone(wh_err_t *err, uint64_t gen) {
    return wh_err_set(err, WH_E_GONE, "generation %llu was reclaimed", (unsigned long long)gen);
}

/* The shm params side file (wh_pfile.c): the operations the shm backend
 * puts in its table, and removal by `clean`. */
bool wh_pfile_set(wh_store_t *st, const char *doc, size_t len, uint64_t *version, wh_err_t *err);
bool wh_pfile_get(wh_store_t *st, uint64_t *version, char **doc, size_t *len, wh_err_t *err);
bool wh_pfile_version(wh_store_t *st, uint64_t *version, wh_err_t *err);
void wh_pfile_close(wh_store_t *st);
bool wh_pfile_clean(const char *name, wh_err_t *err);
/* The fork guard, one meaning for every call on a handle: it belongs to
 * the process that opened it (shared locks, a MongoDB client's sockets). */
bool wh_store_here(const wh_store_t *st, wh_err_t *err);
/* The read position check every read path calls (copy, view, the read
 * policy, MongoDB's encoded read): pos must be below SWAP_CAP. Inline: the
 * backends call it, and they call nothing of wh_store.c. */
static inline bool wh_store_pos_check(const wh_store_t *st, uint32_t pos, wh_err_t *err) {
    if (pos >= st->cfg.swap_cap)
        return wh_err_set(err, WH_E_INVALID, "position %u out of range (SWAP_CAP=%u)", pos,
                          st->cfg.swap_cap);
    return true;
}

/* Backends. */
wh_store_t *wh_shm_open(const wh_store_config_t *cfg, wh_err_t *err);
/* Removes the segment cfg->uri names. One that records a source other
 * than cfg->origin_id (NULL: none, a plain store) is refused (WH_E_SCHEMA,
 * nothing removed): a copy goes only as its store's copy, a plain store
 * never as one. */
bool wh_shm_clean(const wh_store_config_t *cfg, wh_err_t *err);
/* The source the segment of shm store name records: *found false when
 * there is none; id ("" in a plain store, WH_ORIGIN_ID_LEN bytes) and
 * oname (WH_ORIGIN_NAME_LEN) when there is. False with err when the file
 * is refused or is no whole segment of this build. */
bool wh_shm_origin(const char *name, bool *found, char *id, char *oname, wh_err_t *err);
/* Byte offsets inside an shm segment, for tests and fuzzers that forge
 * damage (the layout is private to wh_shm.c). */
typedef struct {
    size_t hdr_lock, leader_pid, leader_token, lease_expiry_ns, lease_ns;
    size_t slots, slot_size, slot_lock, slot_gen, slot_used, slot_count, slot_nholes, slot_holes;
    size_t hdr_size; /* the header, before page rounding (the /dev/shm a store reserves) */
} wh_shm_layout_t;
void wh_shm_layout(wh_shm_layout_t *l);
/* The relay's mirror of a sealed generation (wh_relay.c): an shm store
 * whose lease the caller holds takes generation gen with the same number
 * and positions. begin opens gen as the write generation (creating the
 * segment with budget bytes per area when it does not exist; WH_E_PINNED
 * while readers pin every free area); reserve gives size bytes of its area
 * for position pos (pos must be the next uncommitted one); commit makes pos
 * readable once the caller has written and checked its encoded bytes; the
 * ordinary seal then publishes gen. A kill at any point leaves the read
 * generation readable; the next begin takes the area over. */
bool wh_shm_mirror_begin(wh_store_t *st, uint64_t gen, uint64_t budget, wh_err_t *err);
bool wh_shm_mirror_reserve(wh_store_t *st, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                           wh_err_t *err);
bool wh_shm_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err);

/* Gives the buffer an encoded sample of meta->total_size bytes is written
 * into (the header first, then the data chunks as stored). */
typedef bool (*wh_raw_fn)(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err);
/* Reads the encoded sample at (gen, pos) of a mongodb store whole into the
 * buffer fn gives, every field's checksum checked. */
bool wh_mongo_read_encoded(wh_store_t *st, uint64_t gen, uint32_t pos, wh_raw_fn fn, void *ctx,
                           wh_sample_meta_t *meta, wh_err_t *err);
wh_store_t *wh_mongo_open(const wh_store_config_t *cfg, wh_err_t *err);
bool wh_mongo_clean(const wh_store_config_t *cfg, wh_err_t *err);
/* Collection names of the store's database; *names: wh_mongo_names_free. */
bool wh_mongo_collections(const wh_store_config_t *cfg, char ***names, wh_err_t *err);
void wh_mongo_names_free(char **names);

/* One more sample, made under params version v, in a generation's figures
 * (both backends' gen_params count with it; ext/store/wh_status.c). */
void wh__gen_params_add(wh_gen_params_t *out, uint64_t v);

#endif
