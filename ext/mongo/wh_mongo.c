/* MongoDB backend on libmongoc/libbson.
 *
 * Collections (all prefixed with cfg->prefix, "<p>" below):
 *   <p>.state        {_id:"state"}  read_gen, write_gen, retiring, seals,
 *                                   generated, discarded, history[<=16],
 *                                   schema{version,hash,names}, swap_cap
 *                    {_id:"lease"}  owner token, expires (unix ms), pid, host
 *   <p>.gen.<n>      chunks {_id:{s:<sample id>, c:<index>}, d:<binary>}
 *                    and the position counter {_id:"ctr", n}
 *   <p>.gen.<n>.m    manifests {_id:<pos>, s, k, z, b, h}: sample id, chunk
 *                    count, data bytes, chunk size, encoded header bytes
 *   <p>.gen.<n>.c    spec mode only: the generation's claims and params copy
 *                    (wh_mongo_spec.c, wh_mongo_claim.c); the state's spec
 *                    part in wh_mongo_spec_doc.c
 *
 * Put: a sample's data bytes go into chunk documents under a fresh random
 * sample id; then a position is claimed by inserting its manifest with
 * _id = pos, which the unique _id index lets exactly one sample win. The
 * counter proposes pos; a generator that died between counter and manifest
 * leaves a hole, which the next surplus put fills (it lists the manifests and
 * inserts into a missing position), so a generation always completes with
 * exactly positions 0..swap_cap-1, each pointing at complete chunks.
 *
 * Seal: when the write generation W holds swap_cap manifests, one update of
 * the state document conditional on write_gen == W makes W the read
 * generation and opens W+1 (the atomic swap). Then every generation
 * collection older than W except the retiring one (the previous read
 * generation) is dropped.
 *
 * Read: manifest first (validated with wh_sample_decode_meta), then the
 * chunks by _id with a cursor whose batchSize keeps replies under the
 * server's message limit; each chunk is checked against the manifest and
 * its bytes are copied straight into the caller's field buffers. Missing
 * data in a generation that is no longer live reads as WH_E_GONE; in a live
 * one as WH_E_CORRUPT.
 *
 * Generation ids start from the wall clock in microseconds whenever the
 * state document is created, so they keep increasing across a wiped
 * database. Nothing here relies on sessions, transactions, pipeline updates,
 * `hello`, or listCollections filters, which the in-memory test server
 * lacks; the same code is right for MongoDB 6/7. */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* ---- status ---- */

static bool wh__mongo_status(wh_store_t *st, wh_status_t *o, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    memset(o, 0, sizeof *o);
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return false;
    uint64_t fill = 0;
    bool full = false;
    if (!wh__gen_full(m, s.write_gen, &full, &fill, err)) return false;
    uint64_t owner = 0, pid = 0;
    int64_t left = 0;
    bool live = false;
    if (!wh__lease_get(m, &owner, &pid, &left, &live, err)) return false;
    o->read_gen = s.read_gen;
    o->write_gen = s.write_gen;
    o->write_fill = (uint32_t)(fill < st->cfg.swap_cap ? fill : st->cfg.swap_cap);
    o->swap_cap = st->cfg.swap_cap;
    o->write_bytes = 0; /* the server holds the bytes; no budget here */
    o->byte_budget = 0;
    o->generated = s.generated + o->write_fill;
    o->discarded = s.discarded;
    o->seals = s.seals;
    /* the newest of: a discarded put, a put into the write or the read generation */
    o->last_put_ns = s.last_put_ns;
    const uint64_t gens[2] = {s.write_gen, s.read_gen};
    for (int i = 0; i < 2; i++) {
        uint64_t t = 0;
        if (gens[i] && !wh__gen_last_put(m, gens[i], &t, err)) return false;
        if (t > o->last_put_ns) o->last_put_ns = t;
    }
    if (live) {
        o->leader_pid = pid;
        o->lease_left_s = (double)left / 1000.0;
    }
    o->nhistory = s.nhist;
    for (int i = 0; i < s.nhist; i++) {
        o->history[i].generation = s.hist[i].generation;
        o->history[i].time_ns = s.hist[i].time_ns;
        o->history[i].generated = s.hist[i].generated;
        o->history[i].discarded = s.hist[i].discarded;
        o->history[i].seal_ns = s.hist[i].seal_ns;
    }
    wh_err_t e = {0};
    wh__readers_status(m, o, &e); /* the store's figures stand without the readers' */
    return true;
}

/* ---- open / clean / destroy ---- */

static void wh__mongo_destroy(wh_store_t *st) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    if (!m) return;
    if (m->client) {
        /* in a forked child the socket is the parent's: drop it unused */
        if (getpid() != m->pid) mongoc_client_reset(m->client);
        mongoc_client_destroy(m->client);
    }
    free(m->buf);
    free(m->seen);
    for (int i = 0; i < WH_MAX_FIELDS; i++) wh_field_hash_free(m->hashes[i]);
    free(m);
}

static bool wh__check_cfg(const wh_store_config_t *cfg, wh_err_t *err) {
    const char *p = cfg->prefix && *cfg->prefix ? cfg->prefix : "wirehead";
    if (strlen(p) > 100)
        return wh_err_set(err, WH_E_INVALID, "collection prefix '%.40s...' is too long", p);
    if (strchr(p, '$'))
        return wh_err_set(err, WH_E_INVALID, "collection prefix '%s' may not contain '$'", p);
    return true;
}

static wh__mongo_t *wh__new(const wh_store_config_t *cfg, wh_err_t *err) {
    if (!wh__check_cfg(cfg, err)) return NULL;
    wh__mongo_t *m = calloc(1, sizeof *m);
    if (!m) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    m->base.ops = &wh_mongo_ops;
    m->base.cfg = *cfg;
    m->pid = getpid();
    m->token = wh__rand64() >> 1 | 1;
    snprintf(m->prefix, sizeof m->prefix, "%s",
             cfg->prefix && *cfg->prefix ? cfg->prefix : "wirehead");
    if (gethostname(m->host, sizeof m->host) != 0) snprintf(m->host, sizeof m->host, "?");
    m->host[sizeof m->host - 1] = '\0';
    if (!wh__mongo_connect(m, cfg, err)) {
        wh__mongo_destroy(&m->base);
        return NULL;
    }
    return m;
}

static wh_store_t *wh__mongo_open(const wh_store_config_t *cfg, wh_err_t *err) {
    uint64_t cb = cfg->chunk_bytes ? cfg->chunk_bytes : WH__DEFAULT_CHUNK;
    if (cb > WH__MAX_CHUNK)
        return wh_err_set(err, WH_E_INVALID,
                          "CHUNKSIZE of %llu bytes is too large for a MongoDB document; use at "
                          "most %u bytes (15.98 MiB)",
                          (unsigned long long)cb, WH__MAX_CHUNK),
               NULL;
    wh__mongo_t *m = wh__new(cfg, err);
    if (!m) return NULL;
    m->chunk_bytes = cb;
    /* Reaches the server (bounded by the connect timeout), creates the state
     * on first use and checks the schema. */
    wh__state_t s;
    bool exists = true;
    if (!wh__state_get(m, !cfg->no_create, &s, &exists, err) ||
        (!exists && !wh_err_set(err, WH_E_NOTFOUND, "no such store (no state document)"))) {
        wh_err_prefix(err, "open collection prefix '%s'", m->prefix);
        wh__mongo_destroy(&m->base);
        return NULL;
    }
    return &m->base;
}

static bool wh__mongo_clean(const wh_store_config_t *cfg, wh_err_t *err) {
    wh__mongo_t *m = wh__new(cfg, err);
    if (!m) return false;
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    /* listCollections filters are not honoured everywhere: filter here */
    char **names = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    bool ok = true;
    if (!names) {
        ok = wh__merr(m, err, &e, "clean collection prefix '%s': list collections", m->prefix);
    } else {
        char state[WH__NAME_MAX], gen[WH__NAME_MAX];
        char readers[WH__NAME_MAX];
        snprintf(state, sizeof state, "%s.state", m->prefix);
        snprintf(readers, sizeof readers, "%s.readers", m->prefix);
        int glen = snprintf(gen, sizeof gen, "%s.gen.", m->prefix);
        for (char **p = names; *p && ok; p++) {
            bool ours = strcmp(*p, state) == 0 || strcmp(*p, readers) == 0;
            if (!ours && strncmp(*p, gen, (size_t)glen) == 0) {
                const char *q = *p + glen;
                size_t digits = strspn(q, "0123456789");
                /* .c: a spec generation's claims (wh_mongo_spec.c) */
                ours = digits > 0 && (q[digits] == '\0' || strcmp(q + digits, ".m") == 0 ||
                                      strcmp(q + digits, ".c") == 0);
            }
            if (!ours) continue;
            mongoc_collection_t *c = wh__coll(m, *p);
            if (!mongoc_collection_drop_with_opts(c, NULL, &e) && e.code != 26 &&
                !strstr(e.message, "ns not found"))
                ok = wh__merr(m, err, &e, "clean collection prefix '%s': drop %s", m->prefix, *p);
            mongoc_collection_destroy(c);
        }
        bson_strfreev(names);
    }
    wh__mongo_destroy(&m->base);
    return ok;
}

/* The database's collection names (to tell a user whose database holds
 * another layout, e.g. the original wirehead's, what they are looking at):
 * *names and its strings malloc'd, the caller's. */
static bool wh__mongo_collections(const wh_store_config_t *cfg, char ***names, wh_err_t *err) {
    wh__mongo_t *m = wh__new(cfg, err);
    if (!m) return false;
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    char **got = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    bool ok = got != NULL || wh__merr(m, err, &e, "list collections of '%s'", m->db);
    size_t n = 0;
    while (got && got[n]) n++;
    *names = ok ? calloc(n + 1, sizeof **names) : NULL;
    if (ok && !*names) ok = wh_err_set(err, WH_E_SYS, "out of memory");
    for (size_t i = 0; ok && i < n; i++)
        if (!((*names)[i] = strdup(got[i]))) {
            for (size_t j = 0; j < i; j++) free((*names)[j]);
            free(*names);
            *names = NULL;
            ok = wh_err_set(err, WH_E_SYS, "out of memory");
        }
    bson_strfreev(got);
    wh__mongo_destroy(&m->base);
    return ok;
}

const wh_store_ops_t wh_mongo_ops = {
    .name = "mongodb",
    .open = wh__mongo_open,
    .clean = wh__mongo_clean,
    .put = wh__mongo_put,
    .lead = wh__mongo_lead,
    .resign = wh__mongo_resign,
    .seal = wh__mongo_seal,
    .current = wh__mongo_current,
    .read = wh__mongo_read,
    .status = wh__mongo_status,
    .params_set = wh__mongo_params_set,
    .params_get = wh__mongo_params_get,
    .params_version = wh__mongo_params_version,
    .spec_claim = wh__mongo_spec_claim,
    .spec_renew = wh__mongo_spec_renew,
    .spec_fail = wh__mongo_spec_fail,
    .spec_put = wh__mongo_spec_put,
    .spec_locate = wh__mongo_spec_locate,
    .spec_need = wh__mongo_spec_need,
    .spec_params = wh__mongo_spec_params,
    .spec_status = wh__mongo_spec_status,
    .destroy = wh__mongo_destroy,
    .collections = wh__mongo_collections,
    .beat = wh__mongo_beat,
    .beat_every_s = WH_READER_BEAT_MONGO_S,
    .gen_params = wh__mongo_gen_params,
    .read_encoded = wh__mongo_read_encoded,
};
