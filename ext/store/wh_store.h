/* The store: what callers use, over whichever backend a URI's scheme names
 * (the scheme table, wh_scheme.c). Its types are in wh_store_types.h.
 *
 * Generations are numbered; gen 0 means "none". The write generation takes
 * the first swap_cap committed samples; a seal makes it the read generation
 * in one atomic step and opens the next write generation. A few
 * generations exist (write, read, retiring, and any pinned by readers). */
#ifndef WH_STORE_H
#define WH_STORE_H

#include "wh_store_types.h"

/* Opens (creating on first use) the store named by cfg->uri. With an shm
 * store and byte_budget 0 only a put creates the segment: until one has,
 * current() gives 0, a put creates it sized from its sample, and the other
 * calls fail with WH_E_NOSTORE. An shm handle notices, within a second, a
 * segment removed or created again under its name and moves to it. The returned
 * handle is owned by the caller: wh_store_destroy. Not fork-safe: open after
 * fork. One handle may be used by one thread at a time. */
wh_store_t *wh_store_open(const wh_store_config_t *cfg, wh_err_t *err);
void wh_store_destroy(wh_store_t *st);

/* Generator side. Encodes and commits one sample. Never blocks on a full
 * generation (surplus is discarded and counted); waits up to wait_ms only
 * when the write area's bytes are exhausted, then returns WH_PUT_WAIT with
 * nothing stored. *gen receives the write generation (may be NULL). */
bool wh_store_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                  wh_put_status_t *status, uint64_t *gen, wh_err_t *err);

/* Manager side. lead acquires or renews the manager lease (leader=false if
 * another live manager holds it). seal seals the write generation if it is
 * full (sealed=false otherwise); only the lease holder may seal. resign
 * gives the lease up. */
bool wh_store_lead(wh_store_t *st, bool *leader, wh_err_t *err);
bool wh_store_resign(wh_store_t *st, wh_err_t *err);
bool wh_store_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err);

/* Reader side. current gives the read generation (0 if none yet). read
 * validates the sample at (gen, pos < swap_cap), asks fn for destinations
 * and copies each field once into them. WH_E_GONE if gen was reclaimed
 * (before or during the copy: then the destinations hold garbage),
 * WH_E_CORRUPT if the stored sample fails validation. meta receives the
 * sample's layout (may be NULL). */
bool wh_store_current(wh_store_t *st, uint64_t *gen, wh_err_t *err);
bool wh_store_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                   wh_sample_meta_t *meta, wh_err_t *err);
bool wh_store_status(wh_store_t *st, wh_status_t *out, wh_err_t *err);

/* The one read policy every reader uses (loader threads, map-style and
 * iterable datasets): a reclaimed generation (GONE, or NOTFOUND/UNAVAIL
 * after a server lost it) moves the read to the newest generation, waiting
 * with bounded backoff up to timeout_s for one; a CORRUPT sample is skipped,
 * counted, and its next neighbour stands in marked as padding. A reader that
 * keeps losing the race never gives up while newer generations appear:
 * after WH_READ_HOLD_AFTER lost races its copies hold the generation
 * (read_held, shm), which cannot lose; on mongodb each loss moves on to the
 * generation the state document names. Only timeout_s without a newer
 * generation (or *stop) ends it. */
#define WH_READ_HOLD_AFTER 2     /* lost races before a copy holds its generation */
#define WH_READ_BACKOFF_MIN_MS 2 /* first wait for a newer generation */
#define WH_READ_BACKOFF_MAX_MS 100
#define WH_READ_EXACT_LOST 64 /* spec mode: its generation reclaimed this often in a row */

typedef struct {
    uint64_t gen;     /* in: generation to read (0: the newest); out: the one read */
    uint32_t pos;     /* in: position; out: the position read (a neighbour after a skip) */
    bool strict;      /* in: fail on a corrupt sample (an indexed read) instead of skipping */
    bool pad;         /* out: a corrupt sample was skipped for this item */
    uint32_t gone;    /* out: reclaims retried */
    uint32_t corrupt; /* out: corrupt samples skipped */
    char last_skip[WH_ERR_LEN]; /* out: why the last sample was skipped */
    /* in, spec mode: gen holds spec generation spec_gen; a reclaimed gen is
     * located again (waiting up to timeout_s while it is made again), never
     * replaced by the newest, and a corrupt sample is an error */
    bool exact;
    uint64_t spec_gen;
} wh_read_at_t;

/* Newest read generation other than newer_than (0: any), waiting with
 * bounded backoff up to timeout_s while there is none or the server is
 * unavailable; *stop (may be NULL) ends the wait early. WH_E_TIMEOUT names
 * newer_than; the last UNAVAIL error is returned instead if there was one. */
bool wh_store_wait_gen(wh_store_t *st, uint64_t newer_than, double timeout_s, const bool *stop,
                       uint64_t *gen, wh_err_t *err);

/* Reads at->pos of at->gen under the policy above. fn sees at->gen and
 * at->pos as they are for the attempt it is called in. */
bool wh_store_read_sample(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                          wh_dest_fn fn, void *ctx, wh_sample_meta_t *meta, wh_err_t *err);

/* Store-backed view of the sample at (gen, pos): *out (the caller's
 * reference, wh_buf_unref) points at the encoded sample in a read-only
 * mapping of the store; field i is at data + meta->f[i].offset. The view
 * pins the generation's area for this process until its last reference
 * goes; checksums are verified once, here. WH_E_PINNED when this process
 * already pins another generation (one at a time) or too many processes pin
 * this one; WH_E_INVALID on a store whose backend has no views
 * (WH_CAP_VIEWS). */
bool wh_store_view(wh_store_t *st, uint64_t gen, uint32_t pos, wh_buf_t **out,
                   wh_sample_meta_t *meta, wh_err_t *err);
/* As wh_store_view, for a handle with DMA views (below): known[f] (0:
 * none) is field f's stored checksum as a DataLoader worker of this reader
 * read it, after verifying the bytes against it in its own view. A field
 * whose stored checksum is still that is not hashed again (a sealed area
 * is not written while it holds its generation); any other is verified. */
bool wh_store_view_known(wh_store_t *st, uint64_t gen, uint32_t pos, const uint64_t *known,
                         wh_buf_t **out, wh_sample_meta_t *meta, wh_err_t *err);
/* Views of this handle are held only until a device copy from them has
 * completed: like a held copy, they are outside the one-generation-per-
 * process policy (a generation change never waits on them for longer than
 * the copies in flight). */
void wh_store_set_dma_views(wh_store_t *st, bool on);
/* The read-only mapping a view points into: *base, *len, and a counted
 * reference (wh_store_map_unref) that keeps it mapped. NULL for a buffer
 * that is not a store view of a backend with WH_CAP_MAPPABLE. The
 * reference is the mapping's identity: a segment created again or grown is
 * another mapping. */
void *wh_store_view_map(const wh_buf_t *view, const void **base, size_t *len);
void wh_store_map_unref(void *map);
/* Whether anything but one reference (the caller's) keeps map mapped: a
 * handle on its segment or a live view. False: no view of it is left, and
 * only a handle attaching to the segment anew could make one. */
bool wh_store_map_in_use(void *map);
/* Called after every copy out of a view, before the copy is handed on:
 * false (WH_E_CORRUPT naming the store's file) when the file was cut so
 * that the copy read zero pages (docs/design.md, "Shared mappings can
 * shrink"). True for a buffer that is not a store view. */
bool wh_store_view_intact(const wh_buf_t *view, wh_err_t *err);
/* The read policy above, taking a view instead of copying. */
bool wh_store_view_sample(wh_store_t *st, wh_read_at_t *at, double timeout_s, const bool *stop,
                          wh_buf_t **out, wh_sample_meta_t *meta, wh_err_t *err);

/* ---- Parameters (docs/params.md) ----
 *
 * A small versioned document (JSON text, at most WH_PARAMS_MAX bytes) any
 * participant may set and generators read. Every set bumps the version by
 * one (version 0: never set, the document "{}"); concurrent setters
 * serialise and get distinct versions; a reader never sees a torn
 * document. shm: a side file /dev/shm/wirehead-params.NAME (double buffer
 * under a seqlock, each slot with version, length and XXH3); MongoDB: a
 * document per version in the state collection, each inserted whole under
 * a unique _id (wh_mongo_params.c). */
/* Stores the document doc (len bytes, not NUL-terminated); *version gets
 * its version. WH_E_TOOBIG past WH_PARAMS_MAX, naming the size. */
bool wh_store_params_set(wh_store_t *st, const char *doc, size_t len, uint64_t *version,
                         wh_err_t *err);
/* The current document: *doc (malloc'd, NUL-terminated, the caller's to
 * free) and its *len and *version; "{}" and 0 when never set. */
bool wh_store_params_get(wh_store_t *st, uint64_t *version, char **doc, size_t *len, wh_err_t *err);
/* The current version, cheaply: shm reads one word; MongoDB answers from
 * what the handle's last state read (every put) said, asking the server
 * at most every WH_PARAMS_POLL_S (wh_mongo.h). */
bool wh_store_params_version(wh_store_t *st, uint64_t *version, wh_err_t *err);
/* The params version this handle's later puts record in their samples. */
void wh_store_set_put_params(wh_store_t *st, uint64_t version);
/* The params version recorded by the sample this handle's last read
 * (wh_store_read, the read policy, a view) returned. */
uint64_t wh_store_last_params(const wh_store_t *st);

/* The params versions of a sealed generation's samples (wh_gen_params_t).
 * Fixed once sealed: a handle keeps the last answer. */
bool wh_store_gen_params(wh_store_t *st, uint64_t gen, wh_gen_params_t *out, wh_err_t *err);

/* Readers: with v > 0, wh_store_current (and so every read policy) offers
 * only generations all of whose samples were made under params version
 * >= v; a newer read generation that is not gives the last one that was
 * (0 until one is), so waits for one end at their timeout, saying so. */
void wh_store_set_min_params(wh_store_t *st, uint64_t v);

/* Claims the next index to materialize: a dead or expired claimer's index
 * of the open generation first (attempt + 1), else its next unclaimed one;
 * opens the next needed spec generation when none is open. WH_E_SPECFAIL
 * when an index of the open generation failed every attempt. */
bool wh_store_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                         wh_claim_status_t *status, wh_err_t *err);
/* Extends c's lease by lease_s; *mine false once it is no longer this claim
 * (taken over after expiry, put by another, or its generation abandoned). */
bool wh_store_spec_renew(wh_store_t *st, const wh_claim_t *c, double lease_s, bool *mine,
                         wh_err_t *err);
/* The claimer's fn raised: records why (truncated to fit) and frees the
 * index for another attempt; at max_attempts attempts it fails for good
 * (*failed), and claims and locates of its generation report it. */
bool wh_store_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts, const char *why,
                        bool *failed, wh_err_t *err);
/* Puts sample c->index at c->pos of c->gen (any process may: the first
 * complete put of a position wins, later ones are dropped and counted). The
 * put that commits the last position seals the generation (*sealed). Waits
 * up to the lease while the area's bytes are full. */
bool wh_store_spec_put(wh_store_t *st, const wh_claim_t *c, const wh_array_t *arr, int n,
                       wh_spec_put_t *status, bool *sealed, wh_err_t *err);
/* The generation holding sealed spec generation s (*gen 0: not sealed, or
 * not stored any more). WH_E_SPECFAIL when s failed. */
bool wh_store_spec_locate(wh_store_t *st, uint64_t s, uint64_t *gen, wh_err_t *err);
/* This handle's reader needs spec generation s and the later ones: published
 * with its heartbeat (call before locating s, and again while waiting);
 * pruned when its process dies (shm) or stays silent WH_READER_LIVE_S. */
bool wh_store_spec_need(wh_store_t *st, uint64_t s, wh_err_t *err);
/* The params document in force for c's spec generation (*doc malloc'd and
 * NUL-terminated, the caller's to free). */
bool wh_store_spec_params(wh_store_t *st, const wh_claim_t *c, char **doc, size_t *len,
                          wh_err_t *err);
bool wh_store_spec_status(wh_store_t *st, wh_spec_status_t *out, wh_err_t *err);

/* Removes everything this store holds (shm: its segment and params file;
 * MongoDB: its collections); nothing else. Works whether or not the store
 * exists. */
bool wh_store_clean(const wh_store_config_t *cfg, wh_err_t *err);

/* The handle's configuration (the uri an owned copy; dbname and prefix NULL). */
const wh_store_config_t *wh_store_config(const wh_store_t *st);

/* The names of the collections in the store's database, whoever made them
 * (*names: wh_store_names_free); WH_E_INVALID naming the backend for one
 * without a database (shm). */
bool wh_store_collections(const wh_store_config_t *cfg, char ***names, wh_err_t *err);
void wh_store_names_free(char **names);

/* ---- Backends and what they can do (the scheme table, wh_scheme.c) ---- */

/* What a URI's scheme names (no store is opened). */
typedef struct {
    char scheme[16];     /* the scheme as written, without "://": "shm", "mongodb+srv" */
    const char *backend; /* the backend's name: "shm", "mongodb" (static) */
    unsigned caps;       /* WH_CAP_* */
    /* the store's name, a pointer into the URI after "://", for a backend
     * whose stores are named locally (shm://NAME; not checked here:
     * wh_shm_check_name); NULL for one whose URI is a server's address */
    const char *name;
} wh_backend_info_t;

/* The backend of uri's scheme; WH_E_INVALID naming every scheme the table
 * knows when it knows none that starts uri. */
bool wh_store_backend_of(const char *uri, wh_backend_info_t *out, wh_err_t *err);
/* What the handle's store can do (WH_CAP_*). */
unsigned wh_store_caps(const wh_store_t *st);

/* ---- The node-local tier's copy (read/wh_relay.c, docs/relay.md) ----
 * Each needs its capability (WH_CAP_RELAY_SOURCE for the source,
 * WH_CAP_RELAY_TARGET for the copy): WH_E_INVALID naming the backend
 * otherwise. */

/* Reads the encoded sample at (gen, pos) of a relay's source whole into the
 * buffer fn gives, every field's checksum checked. */
bool wh_store_read_encoded(wh_store_t *st, uint64_t gen, uint32_t pos, wh_raw_fn fn, void *ctx,
                           wh_sample_meta_t *meta, wh_err_t *err);
/* The mirror of a sealed generation of another store: a store whose lease
 * the caller holds takes generation gen with the same number and
 * positions. begin opens gen as the write generation (creating the store
 * with budget bytes per area when it does not exist; WH_E_PINNED while
 * readers pin every free area); reserve gives size bytes of its area for
 * position pos (pos must be the next uncommitted one); commit makes pos
 * readable once the caller has written and checked its encoded bytes; the
 * ordinary seal then publishes gen. A kill at any point leaves the read
 * generation readable; the next begin takes the area over. */
bool wh_store_mirror_begin(wh_store_t *st, uint64_t gen, uint64_t budget, wh_err_t *err);
bool wh_store_mirror_reserve(wh_store_t *st, uint64_t gen, uint32_t pos, uint64_t size, void **dst,
                             wh_err_t *err);
bool wh_store_mirror_commit(wh_store_t *st, uint64_t gen, uint32_t pos, wh_err_t *err);

/* The fork guard, one meaning for every call on a handle: it belongs to
 * the process that opened it (shared locks, a MongoDB client's sockets).
 * Every call of this API checks it first. */
bool wh_store_here(const wh_store_t *st, wh_err_t *err);

#endif
