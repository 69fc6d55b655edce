/* The backend interface: the operation table a backend fills, the head
 * every backend's handle starts with, and what every backend fills alike
 * (readers in a status, a generation's params figures; wh_backend.c).
 * Below the backends (shm/, mongo/) and the store over them (store/):
 * backends include this and nothing of store/; the store's dispatch
 * reaches a backend only through its table. A backend's extras are in its
 * own header (wh_shm.h, wh_mongo.h). */
#ifndef WH_BACKEND_H
#define WH_BACKEND_H

#include "wh_store_types.h"

/* What one handle has read, for its heartbeat; token names the handle. */
typedef struct {
    uint64_t token;
    int64_t pid;
    uint64_t gen, reads, gen_reads;
    uint64_t start_ns, beat_ns; /* CLOCK_REALTIME */
    uint64_t need;              /* spec mode: the lowest spec generation it needs, + 1 (0: none) */
} wh_reader_beat_t;

/* A backend's operations. The first group every backend fills; any other
 * may be NULL: the store then lacks what it gives (the WH_CAP_* named at
 * it, wh_backend_caps), and the store's call of it fails with WH_E_INVALID
 * naming the backend (the dispatch in store/ checks, so an op never sees a
 * handle of another backend). A new optional op is one more field here,
 * its call in store/ (wh_store_lacks when NULL, then the op) and, where
 * callers ask what a store can do, a WH_CAP_* bit (wh_backend_caps). */
typedef struct wh_store_ops {
    const char *name; /* the backend's name in messages and _C.backend_of: "shm" */
    unsigned flags;   /* what no op says: WH_CAP_PARAMS_FILE */

    /* ---- every backend ---- */
    /* a handle of the store cfg names (the caller's, wh_store_destroy),
     * whose head the backend fills: ops and cfg (the dispatch does the rest) */
    wh_store_t *(*open)(const wh_store_config_t *, wh_err_t *);
    /* removes everything the store holds; true when it holds nothing */
    bool (*clean)(const wh_store_config_t *, wh_err_t *);
    bool (*put)(wh_store_t *, const wh_array_t *arr, int n, unsigned wait_ms, wh_put_status_t *st,
                uint64_t *gen, wh_err_t *);
    bool (*lead)(wh_store_t *, bool *leader, wh_err_t *);
    bool (*resign)(wh_store_t *, wh_err_t *);
    bool (*seal)(wh_store_t *, bool *sealed, wh_seal_info_t *info, wh_err_t *);
    bool (*current)(wh_store_t *, uint64_t *gen, wh_err_t *);
    bool (*read)(wh_store_t *, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                 wh_sample_meta_t *meta, wh_err_t *);
    bool (*status)(wh_store_t *, wh_status_t *, wh_err_t *);
    /* parameters (wh_store.h): set, get, the version cheaply */
    bool (*params_set)(wh_store_t *, const char *doc, size_t len, uint64_t *version, wh_err_t *);
    bool (*params_get)(wh_store_t *, uint64_t *version, char **doc, size_t *len, wh_err_t *);
    bool (*params_version)(wh_store_t *, uint64_t *version, wh_err_t *);
    void (*destroy)(wh_store_t *);

    /* ---- optional ---- */
    /* the rule of a store's name, the URI after "scheme://" (shm://NAME);
     * NULL: the URI is a server's address, not a name */
    bool (*check_name)(const char *name, wh_err_t *);
    /* the collections of the store's database, whoever made them: *names
     * a NULL-terminated array, it and its strings malloc'd (the caller's) */
    bool (*collections)(const wh_store_config_t *, char ***names, wh_err_t *);
    /* [WH_CAP_VIEWS] store-backed view; known (may be NULL): per field, a
     * stored checksum another process of this reader verified the bytes
     * against (wh_store_view_known) */
    bool (*view)(wh_store_t *, uint64_t gen, uint32_t pos, const uint64_t *known, wh_buf_t **out,
                 wh_sample_meta_t *meta, wh_err_t *);
    /* views held for a device copy only (wh_store_set_dma_views) */
    void (*set_dma_views)(wh_store_t *, bool on);
    /* [WH_CAP_PINS] read holding gen for the copy (a transient pin), so a
     * slow copy cannot lose the race with reclamation */
    bool (*read_held)(wh_store_t *, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                      wh_sample_meta_t *meta, wh_err_t *);
    /* [WH_CAP_MAPPABLE] the mapping a view of this backend points into
     * (NULL: view is not one of its views), a counted reference whose
     * object starts with wh_store_map_head_t; its unref, its use check
     * (wh_store.h) */
    void *(*view_map)(const wh_buf_t *view, const void **base, size_t *len);
    void (*map_unref)(void *map);
    bool (*map_in_use)(void *map);
    /* after a copy out of view (wh_store_view_intact): false when its file
     * was cut so that the copy read zero pages; true for a view that is
     * not one of this backend's */
    bool (*view_intact)(const wh_buf_t *view, wh_err_t *);
    /* a reader's heartbeat (see wh_reader_beat_t), every beat_every_s */
    bool (*beat)(wh_store_t *, const wh_reader_beat_t *, wh_err_t *);
    double beat_every_s;
    /* a generation's params versions in one pass; NULL: the dispatch reads
     * each sample's header through read */
    bool (*gen_params)(wh_store_t *, uint64_t gen, wh_gen_params_t *out, wh_err_t *);
    /* [WH_CAP_RELAY_SOURCE] wh_store_read_encoded */
    bool (*read_encoded)(wh_store_t *, uint64_t gen, uint32_t pos, wh_raw_fn fn, void *ctx,
                         wh_sample_meta_t *meta, wh_err_t *);
    /* [WH_CAP_RELAY_TARGET, all three] wh_store_mirror_begin and the rest */
    bool (*mirror_begin)(wh_store_t *, uint64_t gen, uint64_t budget, wh_err_t *);
    bool (*mirror_reserve)(wh_store_t *, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                           wh_err_t *);
    bool (*mirror_commit)(wh_store_t *, uint64_t gen, uint32_t pos, wh_err_t *);
    /* [WH_CAP_SPEC, all of them] spec mode (wh_store.h): the store's calls
     * of the same names, the store in spec mode checked first */
    bool (*spec_claim)(wh_store_t *, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                       wh_claim_status_t *status, wh_err_t *);
    bool (*spec_renew)(wh_store_t *, const wh_claim_t *, double lease_s, bool *mine, wh_err_t *);
    bool (*spec_fail)(wh_store_t *, const wh_claim_t *, uint32_t max_attempts, const char *why,
                      bool *failed, wh_err_t *);
    bool (*spec_put)(wh_store_t *, const wh_claim_t *, const wh_array_t *arr, int n,
                     wh_spec_put_t *status, bool *sealed, wh_err_t *);
    bool (*spec_locate)(wh_store_t *, uint64_t s, uint64_t *gen, wh_err_t *);
    bool (*spec_need)(wh_store_t *, uint64_t s, wh_err_t *);
    bool (*spec_params)(wh_store_t *, const wh_claim_t *, char **doc, size_t *len, wh_err_t *);
    bool (*spec_status)(wh_store_t *, wh_spec_status_t *, wh_err_t *);
} wh_store_ops_t;

/* What a backend's table says its stores can do (WH_CAP_*): its flags and
 * the capability of each optional op it fills. */
unsigned wh_backend_caps(const wh_store_ops_t *ops);

/* Every backend's handle starts with this. */
struct wh_store {
    const wh_store_ops_t *ops;
    wh_store_config_t cfg;
    char *uri;             /* owned copy of cfg.uri */
    int pid;               /* process that opened it: the fork guard */
    wh_reader_beat_t beat; /* this handle's reads (the read policy counts them) */
    uint64_t put_params;   /* params version later puts record */
    /* the dispatch's own (wh_store.c): the params filter of readers */
    uint64_t last_params; /* params version of the sample last read */
    uint64_t min_params;  /* readers: generations under params >= this only */
    uint64_t pv_gen;      /* the last generation checked against min_params */
    bool pv_gen_ok;
    uint64_t pv_ok_gen; /* newest generation found to qualify */
    uint64_t gp_gen;    /* wh_store_gen_params' last answer, for gp_gen */
    wh_gen_params_t gp;
};

/* A view's mapping (ops->view_map) starts with this: the backend whose
 * map_unref and map_in_use take it. */
typedef struct {
    const wh_store_ops_t *ops;
} wh_store_map_head_t;

/* The protocol's shared error texts: every backend reports these cases
 * with the same code and words. */
static inline bool wh_store_err_gone(wh_err_t *err, uint64_t gen) {
    return wh_err_set(err, WH_E_GONE, "generation %llu was reclaimed", (unsigned long long)gen);
}

/* The read position check every read path calls (copy, view, the read
 * policy, an encoded read): pos must be below SWAP_CAP. Inline: the
 * backends call it, and they call nothing of store/. */
static inline bool wh_store_pos_check(const wh_store_t *st, uint32_t pos, wh_err_t *err) {
    if (pos >= st->cfg.swap_cap)
        return wh_err_set(err, WH_E_INVALID, "position %u out of range (SWAP_CAP=%u)", pos,
                          st->cfg.swap_cap);
    return true;
}

/* Adds a reader's beat to a status (same pid and host: one reader, its
 * handles' reads summed); beats older than WH_READER_LIVE_S are left out. */
void wh_status_add_reader(wh_status_t *o, const wh_reader_beat_t *b, const char *host,
                          uint64_t now_ns);

/* One more sample, made under params version v, in a generation's figures
 * (both backends' gen_params count with it). */
void wh_gen_params_add(wh_gen_params_t *out, uint64_t v);

#endif
