/* The types of the store interface (wh_store.h): what callers hand a store
 * and get back, and what every backend fills the same way. Below the
 * backends (ext/backend/), so a backend's operations (wh_backend.h) and the
 * callers' API (ext/store/wh_store.h) speak of one set of types. */
#ifndef WH_STORE_TYPES_H
#define WH_STORE_TYPES_H

#include "wh.h"
#include "wh_sample.h"

typedef struct wh_store wh_store_t;

/* Strings are borrowed for the duration of wh_store_open only: a backend
 * copies what it keeps (the handle's cfg.uri is an owned copy; cfg.dbname
 * and cfg.prefix are NULL after open). */
typedef struct {
    const char *uri;   /* a scheme of the scheme table (wh_scheme.c), then the store */
    uint32_t swap_cap; /* samples per generation */
    wh_schema_t schema;
    uint64_t byte_budget;     /* shm: bytes for each generation area; 0: auto,
                                 sized from the first sample put, and only a put creates
                                 the store (every other opener waits for it) */
    uint64_t chunk_bytes;     /* mongo: max chunk document payload */
    const char *dbname;       /* mongo: database when the URI names none */
    const char *prefix;       /* mongo: collection name prefix */
    double lease_s;           /* manager lease; a dead leader is replaced after this */
    double connect_timeout_s; /* mongo: bounded wait for the server */
    bool verify_reads;        /* check XXH3 of every field read */
    bool no_create;           /* open only an existing store (WH_E_NOTFOUND otherwise) */
    uint64_t min_params;      /* readers: wh_store_set_min_params at open (0: none) */
    /* shm, a node-local copy (docs/relay.md): what names the store it mirrors,
     * recorded when the copy is created and checked at every attach (a copy
     * of another source, or a plain store, is refused); NULL: a plain store */
    const char *origin_id;   /* a digest, shorter than WH_ORIGIN_ID_LEN */
    const char *origin_name; /* the same in words, redacted: for messages and status */
    /* spec mode (docs/reproducible.md): a store created with spec records
     * run_seed, and every opener must agree (WH_E_SCHEMA naming both) */
    bool spec;
    uint64_t run_seed;
} wh_store_config_t;

#define WH_ORIGIN_ID_LEN 48
#define WH_ORIGIN_NAME_LEN 160

typedef enum {
    WH_PUT_ACCEPTED = 0, /* committed into the write generation */
    WH_PUT_DISCARDED,    /* write generation already had swap_cap samples */
    WH_PUT_WAIT          /* byte budget full: nothing stored, call again */
} wh_put_status_t;

typedef struct {
    uint64_t generation;  /* the generation just sealed */
    uint64_t generated;   /* samples accepted into all generations so far */
    uint64_t discarded;   /* surplus puts discarded so far */
    uint64_t seal_ns;     /* time the seal itself took */
    uint64_t blocked_pid; /* not sealed: a live writer (pid) still writes into the
                              area the next generation needs (shm), or a live reader
                              pins it (blocked_reader); 0 otherwise */
    bool blocked_reader;  /* blocked_pid is a reader holding views of blocked_gen */
    uint64_t blocked_gen;
} wh_seal_info_t;

typedef struct {
    uint64_t read_gen; /* 0 if none yet */
    uint64_t write_gen;
    uint32_t write_fill; /* committed samples in the write generation */
    uint32_t swap_cap;
    uint64_t write_bytes; /* bytes reserved in the write area */
    uint64_t byte_budget;
    uint64_t store_bytes; /* shm: the whole segment (its areas, index, header) */
    uint64_t creator_pid; /* shm: the process that created the segment */
    uint64_t generated;   /* total accepted */
    uint64_t discarded;   /* total surplus */
    uint64_t seals;       /* total seals */
    uint64_t last_put_ns; /* CLOCK_REALTIME of the newest put by any generator; 0: none yet */
    uint64_t leader_pid;  /* 0 if no live lease (shm: pid; mongo: 0/1) */
    double lease_left_s;
    int nareas; /* shm: generation areas, with their reader pins */
    struct {
        uint64_t generation; /* 0: never used */
        uint32_t pins;       /* live views of its samples, all processes */
        uint32_t pinners;    /* processes holding them */
        int64_t pin_pid;     /* one of them */
    } areas[8];
    int nhistory; /* last seals, newest last */
    struct {
        uint64_t generation;
        uint64_t time_ns; /* CLOCK_REALTIME at seal */
        uint64_t generated;
        uint64_t discarded;
        uint64_t seal_ns;
    } history[16];
    /* shm: the source a node-local copy records ("": none, a plain store) */
    char origin_id[WH_ORIGIN_ID_LEN];
    char origin_name[WH_ORIGIN_NAME_LEN];
    int nreaders; /* reader processes that beat in the last WH_READER_LIVE_S */
    struct {
        uint64_t pid;
        char host[64];       /* mongo: the reader's host; "" on shm */
        uint64_t generation; /* the generation it reads now */
        uint64_t reads;      /* samples it has read in all */
        uint64_t gen_reads;  /* samples read of that generation (reuse: / swap_cap) */
        double up_s;         /* since its first read */
        double age_s;        /* since its last beat */
    } readers[16];
} wh_status_t;

/* Readers leave a small heartbeat in the store (every read through the read
 * policy counts; a beat every WH_READER_BEAT_S, WH_READER_BEAT_MONGO_S on
 * MongoDB where it is a round trip) so `status` can list them; a reader
 * silent for WH_READER_LIVE_S is gone. */
#define WH_READER_BEAT_S 1.0
#define WH_READER_BEAT_MONGO_S 5.0
#define WH_READER_LIVE_S 30.0

/* Destination callback for reads: given the validated meta of the sample
 * at (gen, pos), set dst[i] for each field i to a buffer of at least
 * meta->f[i].nbytes bytes (or NULL to skip that field). Return false with
 * err set to refuse (e.g. shape differs from the batch); the read then
 * fails with that error. Called with no lock held. */
typedef bool (*wh_dest_fn)(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err);

/* Gives the buffer an encoded sample of meta->total_size bytes is written
 * into (the header first, then the data chunks as stored): a relay's copy
 * (wh_store_read_encoded). */
typedef bool (*wh_raw_fn)(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err);

/* The params versions of a sealed generation's samples (each sample's
 * header records its own): lowest, highest, and how many samples were made
 * under the highest; samples that fail their check are left out (counted
 * in skipped). */
typedef struct {
    uint64_t min, max;
    uint32_t at_max, samples, skipped;
} wh_gen_params_t;

/* The largest params document a store keeps (docs/params.md; Python reads
 * it as _C.PARAMS_MAX). */
#define WH_PARAMS_MAX (64u * 1024u)

/* The bound of every duration a store takes in seconds (LEASE_SECONDS,
 * CONNECT_TIMEOUT; config.py also bounds READ_TIMEOUT with it): a lease
 * deadline in ns stays far inside uint64. Python reads it as
 * _C.SECONDS_MAX. */
#define WH_SECONDS_MAX 1e6
/* LEASE_SECONDS and CONNECT_TIMEOUT when a caller gives none (config.py's
 * defaults: _C.LEASE_SECONDS_DEFAULT, _C.CONNECT_TIMEOUT_DEFAULT) */
#define WH_LEASE_S_DEFAULT 10.0
#define WH_CONNECT_TIMEOUT_S_DEFAULT 10.0

/* What a store can do, as its backend's operation table says
 * (wh_backend_caps): each is an operation the backend fills, or leaves NULL.
 * _C.backend_of(uri) reports them by name. */
typedef enum {
    WH_CAP_VIEWS = 1u << 0,        /* store-backed views (wh_store_view) */
    WH_CAP_PINS = 1u << 1,         /* copies that pin their generation (the read policy) */
    WH_CAP_MAPPABLE = 1u << 2,     /* views point into a mapping this process can register
                                      with a device (wh_store_view_map) */
    WH_CAP_PARAMS_FILE = 1u << 3,  /* params in a side file of the store's own, made by the
                                      first set and removed by clean (docs/params.md) */
    WH_CAP_RELAY_SOURCE = 1u << 4, /* encoded reads: a relay copies from it (LOCAL_CACHE's
                                      source, wh_store_read_encoded) */
    WH_CAP_RELAY_TARGET = 1u << 5, /* the mirror: a relay copies into it (a LOCAL_CACHE
                                      copy, wh_store_mirror_begin) */
    WH_CAP_SPEC = 1u << 6,         /* spec mode: claims, puts at a position, locates
                                      (wh_store_spec_claim and the rest) */
} wh_cap_t;

/* ---- Spec mode (docs/reproducible.md) ----
 *
 * A store created with cfg.spec fills *spec generations* in order: sample
 * index k belongs to spec generation k / swap_cap at position k % swap_cap.
 * Each spec generation is filled in an ordinary generation (a new id, the
 * read path unchanged) that records its spec label. Generators claim
 * indices under a lease and put each at its position; the first complete
 * put of a position wins; the put that completes a generation seals it.
 * Readers publish the lowest spec generation they still need; only the
 * WH_SPEC_AHEAD spec generations from the lowest any live reader needs are
 * made or kept, so generators never reclaim what a reader has still to
 * read. Stores without these operations report no spec capability. */
#define WH_SPEC_AHEAD 4

typedef struct {
    uint64_t index;          /* k */
    uint64_t spec_gen;       /* k / swap_cap */
    uint32_t pos;            /* k % swap_cap */
    uint64_t gen;            /* the generation (id) being filled */
    uint64_t params_version; /* in force for spec_gen */
    uint32_t attempt;        /* 1 for k's first claim */
    uint64_t token;          /* this claim's (renew, fail) */
} wh_claim_t;

typedef enum {
    WH_CLAIM_OK = 0, /* the claim is filled in: materialize it */
    WH_CLAIM_WAIT,   /* every index of the open generation is claimed by a live claimer */
    WH_CLAIM_AHEAD   /* WH_SPEC_AHEAD generations are made: readers must move on first */
} wh_claim_status_t;

typedef enum {
    WH_SPEC_PUT_ACCEPTED = 0, /* committed at the claim's position */
    WH_SPEC_PUT_SAME,         /* another put of the index won first, same checksums */
    WH_SPEC_PUT_DIFFERENT,    /* another put won first with other bytes: fn is nondeterministic */
    WH_SPEC_PUT_GONE          /* the generation was abandoned or reclaimed: dropped */
} wh_spec_put_t;

#define WH_SPEC_CLAIMS_SHOWN 16

typedef struct {
    bool spec; /* the store is in spec mode */
    uint64_t run_seed;
    bool any_sealed;
    uint64_t last_sealed; /* newest sealed spec generation */
    bool open;
    uint64_t open_gen;  /* the spec generation being filled */
    uint32_t open_fill; /* its committed positions */
    uint64_t floor;     /* the lowest spec generation kept (readers' need, or the last one) */
    bool reader;        /* a live spec reader publishes a need */
    uint64_t slowest;   /* the lowest need of a live reader */
    uint64_t slowest_pid;
    uint64_t duplicates, nondeterministic; /* puts dropped: same bytes, other bytes */
    int nclaims; /* claimed, unfinished indices of the open generation, oldest first */
    struct {
        uint64_t index, pid;
        char host[64];
        double age_s;
        uint32_t attempt;
    } claims[WH_SPEC_CLAIMS_SHOWN];
    bool failed; /* an index failed every attempt: failure says which and why */
    char failure[WH_ERR_LEN];
} wh_spec_status_t;

#endif
