/* MongoDB backend: put (chunks under a fresh sample id, then a position
 * claimed by its manifest; holes of dead generators filled). */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* ---- put ---- */

/* {_id: {$in: [{s: sid, c: 0}, ..., {s: sid, c: nchunks-1}]}}: one sample's
 * chunks, found through the _id index. */
void wh__chunk_filter(bson_t *q, int64_t sid, uint64_t nchunks) {
    bson_t id, in;
    BSON_APPEND_DOCUMENT_BEGIN(q, "_id", &id);
    BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
    for (uint64_t i = 0; i < nchunks; i++) {
        char key[24];
        const char *k;
        bson_t one;
        bson_uint32_to_string((uint32_t)i, &k, key, sizeof key);
        BSON_APPEND_DOCUMENT_BEGIN(&in, k, &one);
        BSON_APPEND_INT64(&one, "s", sid);
        BSON_APPEND_INT64(&one, "c", (int64_t)i);
        bson_append_document_end(&in, &one);
    }
    bson_append_array_end(&id, &in);
    bson_append_document_end(q, &id);
}

bool wh__delete_chunks(wh__mongo_t *m, mongoc_collection_t *c, int64_t sid, uint64_t nchunks,
                       wh_err_t *err) {
    if (!nchunks) return true;
    bson_t sel = BSON_INITIALIZER;
    wh__chunk_filter(&sel, sid, nchunks);
    bson_error_t e;
    bool ok = mongoc_collection_delete_many(c, &sel, NULL, NULL, &e);
    bson_destroy(&sel);
    if (!ok) return wh__merr(m, err, &e, "delete chunks of a discarded sample");
    return true;
}

/* Inserts chunks [from, to) of the sample's data (buf + header_size, len
 * bytes) as {_id:{s,c}, d}, in insert_many calls of bounded size. */
static bool wh__insert_chunks(wh__mongo_t *m, mongoc_collection_t *c, int64_t sid,
                              const unsigned char *data, uint64_t len, uint64_t cb, uint64_t from,
                              uint64_t to, bool *dup, wh_err_t *err) {
    uint64_t per = WH__INSERT_BYTES / cb;
    if (per < 1) per = 1;
    if (per > 1000) per = 1000;
    bson_t **docs = calloc(per, sizeof *docs);
    if (!docs) return wh_err_set(err, WH_E_SYS, "out of memory");
    bool ok = true;
    *dup = false;
    for (uint64_t i = from; ok && i < to;) {
        size_t n = 0;
        for (; n < per && i < to; n++, i++) {
            uint64_t off = i * cb;
            uint64_t clen = len - off < cb ? len - off : cb;
            bson_t *d = bson_sized_new((size_t)clen + 64);
            bson_t id;
            BSON_APPEND_DOCUMENT_BEGIN(d, "_id", &id);
            BSON_APPEND_INT64(&id, "s", sid);
            BSON_APPEND_INT64(&id, "c", (int64_t)i);
            bson_append_document_end(d, &id);
            BSON_APPEND_BINARY(d, "d", BSON_SUBTYPE_BINARY, data + off, (uint32_t)clen);
            docs[n] = d;
        }
        bson_error_t e;
        bson_t *opts = BCON_NEW("ordered", BCON_BOOL(true));
        if (!mongoc_collection_insert_many(c, (const bson_t **)docs, n, opts, NULL, &e)) {
            *dup = wh__is_dup(&e);
            ok = wh__merr(m, err, &e, "write %zu chunks", n);
        }
        bson_destroy(opts);
        for (size_t k = 0; k < n; k++) bson_destroy(docs[k]);
    }
    free(docs);
    return ok;
}

bool wh__insert_manifest(wh__mongo_t *m, mongoc_collection_t *mc, uint32_t pos, int64_t sid,
                         uint64_t nchunks, uint64_t data_len, uint64_t cb, const unsigned char *hdr,
                         uint64_t hlen, bool *won, wh_err_t *err) {
    bson_t d = BSON_INITIALIZER;
    BSON_APPEND_INT32(&d, "_id", (int32_t)pos);
    BSON_APPEND_INT64(&d, "s", sid);
    BSON_APPEND_INT64(&d, "k", (int64_t)nchunks);
    BSON_APPEND_INT64(&d, "z", (int64_t)data_len);
    BSON_APPEND_INT64(&d, "b", (int64_t)cb);
    BSON_APPEND_BINARY(&d, "h", BSON_SUBTYPE_BINARY, hdr, (uint32_t)hlen);
    bson_error_t e;
    bool ok = true;
    *won = mongoc_collection_insert_one(mc, &d, NULL, NULL, &e);
    if (!*won && !wh__is_dup(&e)) ok = wh__merr(m, err, &e, "commit sample at position %u", pos);
    bson_destroy(&d);
    return ok;
}

/* Next candidate position from the generation's counter (may be >= swap_cap). */
static bool wh__claim(wh__mongo_t *m, mongoc_collection_t *c, uint64_t *pos, wh_err_t *err) {
    bson_t *q = BCON_NEW("_id", BCON_UTF8("ctr"));
    /* t: when a generator last put here, for `status` */
    bson_t *upd = BCON_NEW("$inc", "{", "n", BCON_INT64(1), "}", "$max", "{", "t",
                           BCON_INT64((int64_t)wh_now_real_ns()), "}");
    mongoc_find_and_modify_opts_t *o = mongoc_find_and_modify_opts_new();
    mongoc_find_and_modify_opts_set_update(o, upd);
    mongoc_find_and_modify_opts_set_flags(o, MONGOC_FIND_AND_MODIFY_UPSERT |
                                                 MONGOC_FIND_AND_MODIFY_RETURN_NEW);
    bool ok = false;
    for (int attempt = 0; attempt < 3 && !ok; attempt++) {
        bson_t reply;
        bson_error_t e;
        if (mongoc_collection_find_and_modify_with_opts(c, q, o, &reply, &e)) {
            int64_t n = 0;
            if (wh__get_int(&reply, "value.n", &n) && n >= 1) {
                *pos = (uint64_t)(n - 1);
                ok = true;
            } else {
                bson_destroy(&reply);
                break;
            }
        } else if (!wh__is_dup(&e)) { /* a racing upsert inserted it: retry */
            bson_destroy(&reply);
            mongoc_find_and_modify_opts_destroy(o);
            bson_destroy(q);
            bson_destroy(upd);
            return wh__merr(m, err, &e, "claim a position");
        }
        bson_destroy(&reply);
    }
    mongoc_find_and_modify_opts_destroy(o);
    bson_destroy(q);
    bson_destroy(upd);
    if (!ok) return wh_err_set(err, WH_E_INTERNAL, "claim a position: no counter value");
    return true;
}

bool wh__positions(wh__mongo_t *m, mongoc_collection_t *c, unsigned char *have, const char *what,
                   wh_err_t *err) {
    uint32_t cap = m->base.cfg.swap_cap;
    bson_t *filter = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt", BCON_INT64(cap), "}");
    bson_t *opts =
        BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}", "batchSize", BCON_INT32(100000));
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, filter, opts, NULL);
    const bson_t *doc;
    while (mongoc_cursor_next(cur, &doc)) {
        int64_t p;
        if (wh__get_int(doc, "_id", &p) && p >= 0 && p < cap) have[p] = 1;
    }
    bson_error_t e;
    bool ok = true;
    if (mongoc_cursor_error(cur, &e)) ok = wh__merr(m, err, &e, "%s", what);
    mongoc_cursor_destroy(cur);
    bson_destroy(filter);
    bson_destroy(opts);
    return ok;
}

/* Positions 0..swap_cap-1 without a manifest: picks one at random into
 * *hole; *nholes 0 when the generation is full. */
static bool wh__find_hole(wh__mongo_t *m, mongoc_collection_t *mc, uint32_t *hole, uint64_t *nholes,
                          wh_err_t *err) {
    uint32_t cap = m->base.cfg.swap_cap;
    unsigned char *have = calloc(cap, 1);
    if (!have) return wh_err_set(err, WH_E_SYS, "out of memory");
    bool ok = wh__positions(m, mc, have, "list committed positions", err);
    if (ok) {
        uint64_t n = 0;
        for (uint32_t i = 0; i < cap; i++) n += !have[i];
        *nholes = n;
        if (n) {
            uint64_t pick = wh__rand64() % n;
            for (uint32_t i = 0; i < cap; i++) {
                if (!have[i] && pick-- == 0) {
                    *hole = i;
                    break;
                }
            }
        }
    }
    free(have);
    return ok;
}

bool wh__grow(unsigned char **buf, uint64_t *cap, uint64_t need, wh_err_t *err) {
    if (*cap >= need) return true;
    unsigned char *p = realloc(*buf, need);
    if (!p)
        return wh_err_set(err, WH_E_SYS, "out of memory for %llu bytes", (unsigned long long)need);
    *buf = p;
    *cap = need;
    return true;
}

bool wh__encode(wh__mongo_t *m, const wh_array_t *arr, int n, uint64_t pv, wh_sample_meta_t *meta,
                uint64_t *nchunks, wh_err_t *err) {
    const wh_schema_t *schema = &m->base.cfg.schema;
    if (!wh_sample_plan(schema, arr, n, meta, err)) return false;
    meta->params_version = pv;
    if (!wh__grow(&m->buf, &m->buf_cap, meta->total_size, err)) return false;
    if (!wh_sample_encode(m->buf, m->buf_cap, schema, arr, meta, false, err)) return false;
    const uint64_t len = meta->total_size - meta->header_size, cb = m->chunk_bytes;
    *nchunks = (len + cb - 1) / cb;
    if (*nchunks > WH__MAX_CHUNKS)
        return wh_err_set(err, WH_E_TOOBIG,
                          "sample of %llu bytes needs %llu chunks of CHUNKSIZE %llu bytes, more "
                          "than the %u a sample may have; raise CHUNKSIZE",
                          (unsigned long long)len, (unsigned long long)*nchunks,
                          (unsigned long long)cb, WH__MAX_CHUNKS);
    return true;
}

bool wh__write_chunks(wh__mongo_t *m, mongoc_collection_t *c, const wh_sample_meta_t *meta,
                      uint64_t nchunks, int64_t *sid, wh_err_t *err) {
    const unsigned char *data = m->buf + meta->header_size;
    const uint64_t len = meta->total_size - meta->header_size, cb = m->chunk_bytes;
    bool ok = true, dup = false;
    for (int attempt = 0; attempt < 3; attempt++) {
        *sid = (int64_t)(wh__rand64() >> 1) | 1;
        uint64_t half = (nchunks + 1) / 2;
        ok = wh__insert_chunks(m, c, *sid, data, len, cb, 0, half, &dup, err);
        if (ok) {
            wh_fault_put_midway();
            ok = wh__insert_chunks(m, c, *sid, data, len, cb, half, nchunks, &dup, err);
        }
        if (ok || !dup) break;
        /* a 63-bit id collided: drop what we wrote and pick another */
        wh__delete_chunks(m, c, *sid, nchunks, NULL);
    }
    if (!ok) wh__delete_chunks(m, c, *sid, nchunks, NULL);
    return ok;
}

bool wh__mongo_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                   wh_put_status_t *status, uint64_t *genp, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    WH_UNUSED(wait_ms); /* never waits: storage is the server's */
    wh_sample_meta_t meta;
    uint64_t nchunks = 0;
    if (!wh__encode(m, arr, n, st->put_params, &meta, &nchunks, err)) return false;
    const uint64_t hlen = meta.header_size, len = meta.total_size - meta.header_size;
    const uint64_t cb = m->chunk_bytes;

    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "put");
    const uint64_t w = s.write_gen;
    if (genp) *genp = w;
    bool full;
    if (!wh__gen_full(m, w, &full, NULL, err)) return wh_err_prefix(err, "put");
    if (full) { /* surplus: nothing written */
        *status = WH_PUT_DISCARDED;
        return wh__inc_discarded(m, err);
    }

    mongoc_collection_t *c = wh__gen_coll(m, w, false), *mc = wh__gen_coll(m, w, true);
    bool ok = true, accepted = false;
    int64_t sid = 0;
    /* chunks first, under a fresh sample id: invisible until the manifest */
    ok = wh__write_chunks(m, c, &meta, nchunks, &sid, err);
    if (!ok) goto out;

    uint64_t pos = 0;
    ok = wh__claim(m, c, &pos, err);
    if (ok && pos < st->cfg.swap_cap) {
        wh_sample_set_place(m->buf, &meta, w, (uint32_t)pos);
        ok = wh__insert_manifest(m, mc, (uint32_t)pos, sid, nchunks, len, cb, m->buf, hlen,
                                 &accepted, err);
    }
    /* Counter past the end (or our slot taken): fill a hole left by a
     * generator that died between counter and manifest, if any. */
    for (int tries = 0; ok && !accepted && tries < WH__REPAIR_TRIES; tries++) {
        uint32_t hole = 0;
        uint64_t nholes = 0;
        ok = wh__find_hole(m, mc, &hole, &nholes, err);
        if (!ok || nholes == 0) break;
        wh_sample_set_place(m->buf, &meta, w, hole);
        ok = wh__insert_manifest(m, mc, hole, sid, nchunks, len, cb, m->buf, hlen, &accepted, err);
    }
    if (ok && accepted) {
        /* A put that outlived two seals may have committed into a generation
         * already reclaimed (its collection recreated by our writes): that
         * sample is not part of any generation. */
        wh__state_t now;
        bool exists = false;
        ok = wh__state_get(m, false, &now, &exists, err);
        if (ok && !(exists && (w == now.write_gen || w == now.read_gen || w == now.retiring)))
            accepted = false;
        else if (ok)
            goto out; /* committed */
    }
    if (ok) {
        ok = wh__delete_chunks(m, c, sid, nchunks, err);
        if (ok) ok = wh__inc_discarded(m, err);
    }
out:
    mongoc_collection_destroy(c);
    mongoc_collection_destroy(mc);
    if (!ok) return wh_err_prefix(err, "put into generation %llu", (unsigned long long)w);
    *status = accepted ? WH_PUT_ACCEPTED : WH_PUT_DISCARDED;
    return true;
}
