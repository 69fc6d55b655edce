/* MongoDB backend: parameters (docs/params.md). Each version is its own
 * document {_id: {pv: v}, d, n, x} in the state collection: the JSON text
 * as binary, its length and XXH3. A set first claims its version with one
 * conditional update of a counter document ({_id: "params_claimed", v}),
 * so of setters racing for a version exactly one wins and the others claim
 * the next (a unique _id alone did not hold on every server: the in-memory
 * test server let two racing inserts of one _id both in), then inserts it:
 * every set gets a version of its own, and a document is only ever written
 * whole (an insert), never changed in place. The newest version is the document; a set prunes those more than
 * WH__PV_KEEP older, and raises params_version in the state document,
 * which every put reads anyway, so a generator learns of a new version
 * without a round trip of its own. */
#define _GNU_SOURCE
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "wh_mongo_int.h"

#define WH__PV_KEEP 8    /* older versions kept, for readers still on them */
#define WH__PV_TRIES 256 /* setters racing for versions, before giving up */

/* The newest version's document (projection: only its _id when
 * only_version); *found false when none was ever set. */
static bool wh__params_doc(wh__mongo_t *m, bool only_version, bson_t *doc, bool *found,
                           wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *q = BCON_NEW("_id.pv", "{", "$gte", BCON_INT64(1), "}");
    bson_t *opts = BCON_NEW("sort", "{", "_id.pv", BCON_INT32(-1), "}", "limit", BCON_INT64(1),
                            "singleBatch", BCON_BOOL(true));
    if (only_version) BCON_APPEND(opts, "projection", "{", "_id", BCON_INT32(1), "}");
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, opts, NULL);
    const bson_t *d;
    bson_error_t e;
    *found = false;
    if (mongoc_cursor_next(cur, &d)) {
        bson_destroy(doc);
        bson_copy_to(d, doc);
        *found = true;
    }
    bool ok = !mongoc_cursor_error(cur, &e) || wh__merr(m, err, &e, "read params");
    mongoc_cursor_destroy(cur);
    bson_destroy(opts);
    bson_destroy(q);
    mongoc_collection_destroy(c);
    return ok;
}

/* The newest version stored (0: never set). */
static bool wh__params_newest(wh__mongo_t *m, uint64_t *v, wh_err_t *err) {
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__params_doc(m, true, &doc, &found, err);
    *v = found ? wh__get_u64_or0(&doc, "_id.pv") : 0;
    bson_destroy(&doc);
    return ok;
}

/* The last version a setter claimed (0: never set): the counter document
 * {_id: "params_claimed", v}. */
static bool wh__params_claimed(wh__mongo_t *m, mongoc_collection_t *c, uint64_t *v, wh_err_t *err) {
    bson_t q = BSON_INITIALIZER, doc = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&q, "_id", "params_claimed");
    bool found = false;
    bool ok = wh__find_one(m, c, &q, &doc, &found, "read the params version claimed", err);
    *v = found ? wh__get_u64_or0(&doc, "v") : 0;
    bson_destroy(&q);
    bson_destroy(&doc);
    return ok;
}

/* Claims version prev + 1: one conditional update of the counter (an
 * upsert for the first), so of setters racing for it exactly one matches;
 * the others collide on _id or match nothing. *won says which. */
static bool wh__params_claim(wh__mongo_t *m, mongoc_collection_t *c, uint64_t prev, bool *won,
                             wh_err_t *err) {
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("params_claimed"), "v", BCON_INT64((int64_t)prev));
    bson_t *upd = BCON_NEW("$set", "{", "v", BCON_INT64((int64_t)prev + 1), "}");
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
    bson_t reply;
    bson_error_t e;
    bool ok = true;
    *won = false;
    if (mongoc_collection_update_one(c, sel, upd, opts, &reply, &e)) {
        int64_t matched = 0;
        wh__get_int(&reply, "matchedCount", &matched);
        bson_iter_t it;
        *won = matched > 0 || bson_iter_init_find(&it, &reply, "upsertedId");
    } else if (!wh__is_dup(&e)) {
        ok = wh__merr(m, err, &e, "claim params version %llu", (unsigned long long)prev + 1);
    }
    bson_destroy(&reply);
    bson_destroy(sel);
    bson_destroy(upd);
    bson_destroy(opts);
    return ok;
}

bool wh__mongo_params_set(wh_store_t *st, const char *doc, size_t len, uint64_t *version,
                          wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    mongoc_collection_t *c = wh__state_coll(m);
    const int64_t sum = (int64_t)XXH3_64bits(doc, len);
    bool ok = true, stored = false;
    uint64_t v = 0;
    for (int tries = 0; ok && !stored && tries < WH__PV_TRIES; tries++) {
        bool won = false;
        ok = wh__params_claimed(m, c, &v, err) && wh__params_claim(m, c, v, &won, err);
        if (!ok || !won) continue; /* another setter took v + 1: the next one */
        v++;
        bson_t d = BSON_INITIALIZER, id;
        BSON_APPEND_DOCUMENT_BEGIN(&d, "_id", &id);
        BSON_APPEND_INT64(&id, "pv", (int64_t)v);
        bson_append_document_end(&d, &id);
        BSON_APPEND_BINARY(&d, "d", BSON_SUBTYPE_BINARY, (const uint8_t *)doc, (uint32_t)len);
        BSON_APPEND_INT64(&d, "n", (int64_t)len);
        BSON_APPEND_INT64(&d, "x", sum);
        bson_error_t e;
        stored = mongoc_collection_insert_one(c, &d, NULL, NULL, &e);
        if (!stored && !wh__is_dup(&e)) /* dup: left by a setter that died after its claim */
            ok = wh__merr(m, err, &e, "set params version %llu", (unsigned long long)v);
        bson_destroy(&d);
    }
    if (ok && !stored)
        ok = wh_err_set(err, WH_E_TIMEOUT, "set params: %d other sets took every version tried",
                        WH__PV_TRIES);
    if (ok) {
        bson_error_t e;
        bson_t *old = BCON_NEW("_id.pv", "{", "$lt", BCON_INT64((int64_t)v - WH__PV_KEEP), "}");
        if (v > WH__PV_KEEP && !mongoc_collection_delete_many(c, old, NULL, NULL, &e))
            ok = wh__merr(m, err, &e, "prune params versions before %llu",
                          (unsigned long long)(v - WH__PV_KEEP));
        bson_destroy(old);
    }
    if (ok) {
        /* a hint for generators; a setter killed before it leaves them to
         * their poll (WH_PARAMS_POLL_S) */
        bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"));
        bson_t *mx = BCON_NEW("$max", "{", "params_version", BCON_INT64((int64_t)v), "}");
        bson_error_t e;
        if (!mongoc_collection_update_one(c, sel, mx, NULL, NULL, &e))
            ok = wh__merr(m, err, &e, "publish params version %llu", (unsigned long long)v);
        bson_destroy(sel);
        bson_destroy(mx);
    }
    mongoc_collection_destroy(c);
    if (ok) {
        *version = v;
        if (v > m->pv_hint) m->pv_hint = v;
    }
    return ok;
}

bool wh__mongo_params_get(wh_store_t *st, uint64_t *version, char **out, size_t *len,
                          wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    *out = NULL;
    if (!wh__params_doc(m, false, &doc, &found, err)) {
        bson_destroy(&doc);
        return false;
    }
    char *buf = malloc(WH_PARAMS_MAX + 1);
    if (!buf) {
        bson_destroy(&doc);
        return wh_err_set(err, WH_E_SYS, "out of memory");
    }
    if (!found) {
        bson_destroy(&doc);
        memcpy(buf, "{}", 3);
        *out = buf;
        *len = 2;
        *version = 0;
        return true;
    }
    int64_t v = 0, n = -1, x = 0;
    const uint8_t *d = NULL;
    uint32_t dlen = 0;
    bson_iter_t it;
    if (bson_iter_init_find(&it, &doc, "d") && BSON_ITER_HOLDS_BINARY(&it))
        bson_iter_binary(&it, NULL, &dlen, &d);
    bool ok = wh__get_int(&doc, "_id.pv", &v) && wh__get_int(&doc, "n", &n) &&
              wh__get_int(&doc, "x", &x) && d && v >= 1 && n >= 0 && n <= WH_PARAMS_MAX &&
              (uint64_t)n == dlen && XXH3_64bits(d, dlen) == (uint64_t)x;
    if (ok) {
        memcpy(buf, d, dlen);
        buf[dlen] = 0;
        *out = buf;
        *len = dlen;
        *version = (uint64_t)v;
        if ((uint64_t)v > m->pv_hint) m->pv_hint = (uint64_t)v;
    } else {
        free(buf);
        wh_err_set(err, WH_E_CORRUPT,
                   "params document at %s (collection prefix '%s') fails its check: version, "
                   "length (at most %u bytes) or checksum",
                   m->where, m->prefix, WH_PARAMS_MAX);
    }
    bson_destroy(&doc);
    return ok;
}

bool wh__mongo_params_version(wh_store_t *st, uint64_t *version, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    uint64_t now = wh_now_mono_ns();
    if (!m->pv_polled_ns || now - m->pv_polled_ns >= (uint64_t)(WH_PARAMS_POLL_S * 1e9)) {
        uint64_t v = 0;
        if (!wh__params_newest(m, &v, err)) return false;
        m->pv_polled_ns = now;
        m->pv_hint = v; /* the store's own word (a wiped store starts again at 0) */
    }
    *version = m->pv_hint;
    return true;
}

/* Every manifest's header of gen in one cursor (each records its sample's
 * params version). */
bool wh__mongo_gen_params(wh_store_t *st, uint64_t gen, wh_gen_params_t *out, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    uint32_t cap = st->cfg.swap_cap;
    mongoc_collection_t *mc = wh__gen_coll(m, gen, true);
    bson_t *filter = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt", BCON_INT64(cap), "}");
    bson_t *opts =
        BCON_NEW("projection", "{", "h", BCON_INT32(1), "}", "batchSize", BCON_INT32(10000));
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(mc, filter, opts, NULL);
    const bson_t *doc;
    memset(out, 0, sizeof *out);
    while (mongoc_cursor_next(cur, &doc)) {
        int64_t pos = -1;
        const uint8_t *h = NULL;
        uint32_t hlen = 0;
        bson_iter_t it;
        if (bson_iter_init_find(&it, doc, "h") && BSON_ITER_HOLDS_BINARY(&it))
            bson_iter_binary(&it, NULL, &hlen, &h);
        wh_sample_meta_t meta;
        if (!wh__get_int(doc, "_id", &pos) || pos < 0 || pos >= cap || !h ||
            !wh_sample_decode_meta(h, hlen, &st->cfg.schema, gen, (uint32_t)pos, &meta, NULL)) {
            out->skipped++;
            continue;
        }
        wh_gen_params_add(out, meta.params_version);
    }
    bson_error_t e;
    bool ok = !mongoc_cursor_error(cur, &e) ||
              wh__merr(m, err, &e, "read the params versions of generation %llu",
                       (unsigned long long)gen);
    mongoc_cursor_destroy(cur);
    bson_destroy(filter);
    bson_destroy(opts);
    mongoc_collection_destroy(mc);
    if (ok && !out->samples && !out->skipped)
        ok = wh_err_set(err, WH_E_GONE, "generation %llu was reclaimed", (unsigned long long)gen);
    return ok;
}
