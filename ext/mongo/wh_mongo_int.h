/* MongoDB backend: what its files share (wh_mongo_conn.c connection,
 * errors, names, documents; wh_mongo_state.c the state document;
 * wh_mongo_put.c put; wh_mongo_lease.c lease and seal; wh_mongo_read.c
 * read; wh_mongo_beat.c readers' heartbeats; wh_mongo_spec*.c and
 * wh_mongo_claim.c spec mode; wh_mongo.c open, status, clean and the
 * vtable, over all of them). Internal: included only by those files and the
 * fuzz harness. */
#ifndef WH_MONGO_INT_H
#define WH_MONGO_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "wh_fault.h"
#include "wh_mongo.h"

#define WH__HIST 16
#define WH__MAX_CHUNK WH_MONGO_CHUNK_MAX
/* Chunks per sample: a reader's filter names each, and must stay far below
 * the 16 MiB BSON limit (about 30 bytes per chunk). */
#define WH__MAX_CHUNKS (1u << 18)
#define WH__DEFAULT_CHUNK WH_MONGO_CHUNK_DEFAULT
#define WH__BATCH_BYTES (32u * 1000 * 1000)  /* per reply; libmongoc refuses 48 MB */
#define WH__INSERT_BYTES (32u * 1000 * 1000) /* chunk bytes per insert_many call */
#define WH__REPAIR_TRIES 32
#define WH__NAME_MAX 256

/* Spec mode's part of the state document (wh_mongo_spec_doc.c): absent in
 * a store made without RUN_SEED. */
#define WH__SPEC_KEPT 64  /* sealed spec generations the state lists (oldest drop off) */
#define WH__SPEC_FAILS 16 /* indices failed for good it records (the first ones) */
typedef struct {
    bool on;
    uint64_t run_seed;
    uint64_t floor; /* the last need_min computed */
    bool open;      /* a spec generation is being filled: */
    uint64_t open_s, open_g, open_pv;
    uint64_t dup, nondet;
    int nkept;
    struct {
        uint64_t s, g;
    } kept[WH__SPEC_KEPT];
    int nfails;
    struct {
        uint64_t s, k;
    } fails[WH__SPEC_FAILS];
} wh__spec_t;

typedef struct {
    uint64_t read_gen, write_gen, retiring;
    uint64_t seals, generated, discarded;
    uint64_t last_put_ns; /* the newest discarded put (accepted ones: the counter's t) */
    int nhist;
    struct {
        uint64_t generation, time_ns, generated, discarded, seal_ns;
    } hist[WH__HIST];
    wh__spec_t spec;
} wh__state_t;

typedef struct {
    wh_store_t base;
    mongoc_client_t *client;
    char db[128];
    char prefix[128];
    char where[512];  /* URI without credentials or options, for messages */
    char secret[256]; /* userinfo of the URI, scrubbed from libmongoc messages */
    uint64_t token;   /* lease owner id of this handle */
    pid_t pid;
    uint64_t chunk_bytes;
    double wait_s;       /* server selection timeout, for messages */
    uint64_t known_read; /* newest read generation this handle has seen */
    unsigned char *buf;  /* encode buffer, reused across puts */
    uint64_t buf_cap;
    unsigned char *seen; /* chunk bitmap for reads, reused */
    uint64_t seen_cap;
    wh_field_hash_t *hashes[WH_MAX_FIELDS]; /* reads' running checksums, made on first use */
    char host[64];
    uint64_t beats;        /* heartbeats sent by this handle */
    uint64_t pv_hint;      /* newest params version this handle has heard of */
    uint64_t pv_polled_ns; /* when it last asked the server for it */
    /* spec mode: what names this process's node for claims (boot id and pid
     * namespace; "" unknown), and the need this reader last published */
    char node[96];
    bool node_known;
    bool need_sent;
    uint64_t need_s, need_ns;
} wh__mongo_t;

/* wh_mongo_conn.c: connection, errors, names, documents */
bool wh__mongo_connect(wh__mongo_t *m, const wh_store_config_t *cfg, wh_err_t *err);
bool wh__is_unavail(const bson_error_t *e);
bool wh__is_dup(const bson_error_t *e);
bool wh__merr(const wh__mongo_t *m, wh_err_t *err, const bson_error_t *e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
uint64_t wh__rand64(void);
mongoc_collection_t *wh__coll(wh__mongo_t *m, const char *name);
mongoc_collection_t *wh__gen_coll(wh__mongo_t *m, uint64_t gen, bool manifests);
/* When a put last claimed a position of gen (0: none did). */
bool wh__gen_last_put(wh__mongo_t *m, uint64_t gen, uint64_t *t, wh_err_t *err);
mongoc_collection_t *wh__state_coll(wh__mongo_t *m);
bool wh__get_int(const bson_t *doc, const char *key, int64_t *out);
uint64_t wh__get_u64_or0(const bson_t *doc, const char *key);
bool wh__find_one(wh__mongo_t *m, mongoc_collection_t *c, const bson_t *filter, bson_t *out,
                  bool *found, const char *what, wh_err_t *err);

/* wh_mongo_state.c */
bool wh__state_get(wh__mongo_t *m, bool create, wh__state_t *s, bool *exists, wh_err_t *err);
bool wh__inc_discarded(wh__mongo_t *m, wh_err_t *err);
bool wh__gen_full(wh__mongo_t *m, uint64_t gen, bool *full, uint64_t *fill, wh_err_t *err);

/* wh_mongo_spec_doc.c: the spec part of the state document, pure */
void wh__spec_append(bson_t *init, const wh_store_config_t *cfg);
bool wh__spec_check(const wh__mongo_t *m, const bson_t *doc, wh_err_t *err);
bool wh__spec_parse(const wh__mongo_t *m, const bson_t *doc, wh__spec_t *sp, wh_err_t *err);
/* The physical generation holding sealed spec generation s (false: none). */
bool wh__spec_kept(const wh__spec_t *sp, uint64_t s, uint64_t *g);
/* Generation g is a spec generation's, sealed and kept or being filled. */
bool wh__spec_holds(const wh__spec_t *sp, uint64_t g);
bool wh__spec_failed(const wh__spec_t *sp, uint64_t s);

/* wh_mongo_put.c */
bool wh__delete_chunks(wh__mongo_t *m, mongoc_collection_t *c, int64_t sid, uint64_t nchunks,
                       wh_err_t *err);
bool wh__insert_manifest(wh__mongo_t *m, mongoc_collection_t *mc, uint32_t pos, int64_t sid,
                         uint64_t nchunks, uint64_t data_len, uint64_t cb, const unsigned char *hdr,
                         uint64_t hlen, bool *won, wh_err_t *err);
bool wh__grow(unsigned char **buf, uint64_t *cap, uint64_t need, wh_err_t *err);
/* Sets have[p] for each document of c whose _id is a position p (0 ..
 * SWAP_CAP-1): the manifests, or a spec generation's claims. */
bool wh__positions(wh__mongo_t *m, mongoc_collection_t *c, unsigned char *have, const char *what,
                   wh_err_t *err);
/* Encodes a sample into m->buf under params version pv: its layout, and
 * how many chunks its data needs (WH_E_TOOBIG past WH__MAX_CHUNKS). */
bool wh__encode(wh__mongo_t *m, const wh_array_t *arr, int n, uint64_t pv, wh_sample_meta_t *meta,
                uint64_t *nchunks, wh_err_t *err);
/* Writes the data of the sample encoded in m->buf as chunks of c under a
 * fresh sample id *sid; on failure none of them is left. */
bool wh__write_chunks(wh__mongo_t *m, mongoc_collection_t *c, const wh_sample_meta_t *meta,
                      uint64_t nchunks, int64_t *sid, wh_err_t *err);
void wh__chunk_filter(bson_t *q, int64_t sid, uint64_t nchunks);
bool wh__mongo_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                   wh_put_status_t *status, uint64_t *genp, wh_err_t *err);

/* wh_mongo_lease.c */
bool wh__mongo_lead(wh_store_t *st, bool *leader, wh_err_t *err);
bool wh__mongo_resign(wh_store_t *st, wh_err_t *err);
bool wh__lease_get(wh__mongo_t *m, uint64_t *owner, uint64_t *pid, int64_t *left_ms, bool *live,
                   wh_err_t *err);
bool wh__mongo_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err);

/* wh_mongo_beat.c */
mongoc_collection_t *wh__readers_coll(wh__mongo_t *m);
bool wh__mongo_beat(wh_store_t *st, const wh_reader_beat_t *b, wh_err_t *err);
bool wh__readers_status(wh__mongo_t *m, wh_status_t *o, wh_err_t *err);

/* wh_mongo_params.c */
bool wh__mongo_params_set(wh_store_t *st, const char *doc, size_t len, uint64_t *version,
                          wh_err_t *err);
bool wh__mongo_params_get(wh_store_t *st, uint64_t *version, char **doc, size_t *len,
                          wh_err_t *err);
bool wh__mongo_params_version(wh_store_t *st, uint64_t *version, wh_err_t *err);
bool wh__mongo_gen_params(wh_store_t *st, uint64_t gen, wh_gen_params_t *out, wh_err_t *err);

/* wh_mongo_read.c */
bool wh__mongo_current(wh_store_t *st, uint64_t *gen, wh_err_t *err);
bool wh__mongo_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                    wh_sample_meta_t *meta_out, wh_err_t *err);
/* The encoded sample at (gen, pos) whole into the buffer fn gives, every
 * field's checksum checked (wh_store_read_encoded) */
bool wh__mongo_read_encoded(wh_store_t *st, uint64_t gen, uint32_t pos, wh_raw_fn fn, void *ctx,
                            wh_sample_meta_t *meta, wh_err_t *err);

/* wh_mongo_spec.c: spec generations (open, seal, abandon, reclaim), the
 * readers' needs, locate, need, params and status */
mongoc_collection_t *wh__claims_coll(wh__mongo_t *m, uint64_t gen);
/* Raises the counter document {_id: id, n} of cc by one and gives the new
 * n; with below > 0 only while n < below (else *spent, as when the
 * counter is missing). */
bool wh__spec_counter(wh__mongo_t *m, mongoc_collection_t *cc, const char *id, int64_t below,
                      int64_t *n, bool *spent, wh_err_t *err);
/* The live spec readers' needs: the lowest (and its pid), and the distinct
 * values (up to WH__NEEDS). */
#define WH__NEEDS 64
typedef struct {
    bool any;
    uint64_t min, min_pid;
    int n;
    uint64_t s[WH__NEEDS];
} wh__needs_t;
bool wh__spec_needs(wh__mongo_t *m, wh__needs_t *nd, wh_err_t *err);
/* need_min, or the persisted floor without a live reader (persisting a
 * new need_min) */
uint64_t wh__spec_floor(wh__mongo_t *m, const wh__state_t *s, const wh__needs_t *nd);
bool wh__spec_open(wh__mongo_t *m, const wh__state_t *s, uint64_t spec_gen, wh_err_t *err);
bool wh__spec_abandon(wh__mongo_t *m, const wh__state_t *s, wh_err_t *err);
bool wh__spec_reclaim(wh__mongo_t *m, const wh__state_t *s, const wh__needs_t *nd, uint64_t floor,
                      wh_err_t *err);
/* Seals the open generation if every position is committed (*sealed: by
 * this call); a no-op otherwise. */
bool wh__spec_complete(wh__mongo_t *m, const wh__state_t *s, bool *sealed, wh_seal_info_t *info,
                       wh_err_t *err);
/* Marks the claim of position pos of g done: its sample is committed. */
bool wh__spec_claim_done(wh__mongo_t *m, uint64_t g, uint32_t pos, wh_err_t *err);
/* Seals the open generation when every claim is done and every position
 * committed: a put that died between its commit and the seal leaves it so
 * (its claim marked done by whoever found it committed). With a claim not
 * done, its put is still under way and seals. */
bool wh__spec_settle(wh__mongo_t *m, const wh__state_t *s, bool *sealed, wh_seal_info_t *info,
                     wh_err_t *err);
/* Records that index k of spec generation s failed for good (msg: why). */
bool wh__spec_record_fail(wh__mongo_t *m, uint64_t s, uint64_t k, const char *msg, wh_err_t *err);
/* WH_E_SPECFAIL for spec generation s, with the recorded message. */
bool wh__spec_fail_err(wh__mongo_t *m, uint64_t s, wh_err_t *err);
bool wh__mongo_spec_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err);
bool wh__mongo_spec_locate(wh_store_t *st, uint64_t s, uint64_t *gen, wh_err_t *err);
bool wh__mongo_spec_need(wh_store_t *st, uint64_t s, wh_err_t *err);
bool wh__mongo_spec_params(wh_store_t *st, const wh_claim_t *c, char **doc, size_t *len,
                           wh_err_t *err);
bool wh__mongo_spec_status(wh_store_t *st, wh_spec_status_t *o, wh_err_t *err);

/* wh_mongo_claim.c: claims of indices */
bool wh__mongo_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                          wh_claim_status_t *status, wh_err_t *err);
bool wh__mongo_spec_renew(wh_store_t *st, const wh_claim_t *c, double lease_s, bool *mine,
                          wh_err_t *err);
bool wh__mongo_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts,
                         const char *why, bool *failed, wh_err_t *err);

/* wh_mongo_spec_put.c */
bool wh__mongo_spec_put(wh_store_t *st, const wh_claim_t *c, const wh_array_t *arr, int n,
                        wh_spec_put_t *status, bool *sealed, wh_err_t *err);

#endif
