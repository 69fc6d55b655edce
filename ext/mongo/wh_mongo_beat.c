/* MongoDB backend: readers' heartbeats, one document per reader handle in
 * <prefix>.readers, listed by `status`. */
#include "wh_mongo_int.h"

/* Documents silent this long are removed (by any reader's beat, once a
 * minute), so handles that came and went do not pile up. */
#define WH__BEAT_PRUNE_S (10 * WH_READER_LIVE_S)
#define WH__BEATS_PER_PRUNE 12

mongoc_collection_t *wh__readers_coll(wh__mongo_t *m) {
    char name[WH__NAME_MAX];
    snprintf(name, sizeof name, "%s.readers", m->prefix);
    return wh__coll(m, name);
}

bool wh__mongo_beat(wh_store_t *st, const wh_reader_beat_t *b, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    mongoc_collection_t *c = wh__readers_coll(m);
    bson_t q = BSON_INITIALIZER, u = BSON_INITIALIZER, opts = BSON_INITIALIZER, set;
    BSON_APPEND_INT64(&q, "_id", (int64_t)(b->token >> 1));
    BSON_APPEND_DOCUMENT_BEGIN(&u, "$set", &set);
    BSON_APPEND_INT64(&set, "pid", b->pid);
    BSON_APPEND_UTF8(&set, "host", m->host);
    BSON_APPEND_INT64(&set, "gen", (int64_t)b->gen); /* wall-clock ns: below 2^63 */
    BSON_APPEND_INT64(&set, "reads", (int64_t)b->reads);
    BSON_APPEND_INT64(&set, "gen_reads", (int64_t)b->gen_reads);
    BSON_APPEND_INT64(&set, "start_ns", (int64_t)b->start_ns);
    BSON_APPEND_INT64(&set, "beat_ns", (int64_t)b->beat_ns);
    bson_append_document_end(&u, &set);
    if (st->cfg.spec) { /* a spec reader's need stays live while it reads (wh_mongo_spec.c) */
        bson_t cd;
        BSON_APPEND_DOCUMENT_BEGIN(&u, "$currentDate", &cd);
        BSON_APPEND_BOOL(&cd, "at", true);
        bson_append_document_end(&u, &cd);
    }
    BSON_APPEND_BOOL(&opts, "upsert", true);
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, &q, &u, &opts, NULL, &e) ||
              wh__merr(m, err, &e, "reader heartbeat in %s.readers", m->prefix);
    if (ok && ++m->beats % WH__BEATS_PER_PRUNE == 0) {
        bson_t old = BSON_INITIALIZER, lt;
        BSON_APPEND_DOCUMENT_BEGIN(&old, "beat_ns", &lt);
        BSON_APPEND_INT64(&lt, "$lt", (int64_t)(b->beat_ns - (uint64_t)(WH__BEAT_PRUNE_S * 1e9)));
        bson_append_document_end(&old, &lt);
        mongoc_collection_delete_many(c, &old, NULL, NULL, &e); /* best effort */
        bson_destroy(&old);
    }
    bson_destroy(&q);
    bson_destroy(&u);
    bson_destroy(&opts);
    mongoc_collection_destroy(c);
    return ok;
}

bool wh__readers_status(wh__mongo_t *m, wh_status_t *o, wh_err_t *err) {
    uint64_t now = wh_now_real_ns();
    mongoc_collection_t *c = wh__readers_coll(m);
    bson_t f = BSON_INITIALIZER, opts = BSON_INITIALIZER, gte;
    BSON_APPEND_DOCUMENT_BEGIN(&f, "beat_ns", &gte);
    BSON_APPEND_INT64(&gte, "$gte", (int64_t)(now - (uint64_t)(WH_READER_LIVE_S * 1e9)));
    bson_append_document_end(&f, &gte);
    BSON_APPEND_INT32(&opts, "batchSize", 256);
    BSON_APPEND_INT64(&opts, "limit", 256);
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &f, &opts, NULL);
    const bson_t *doc;
    while (mongoc_cursor_next(cur, &doc)) {
        int64_t pid = 0, gen = 0, reads = 0, gen_reads = 0, start = 0, beat = 0;
        if (!wh__get_int(doc, "pid", &pid) || !wh__get_int(doc, "gen", &gen) ||
            !wh__get_int(doc, "reads", &reads) || !wh__get_int(doc, "gen_reads", &gen_reads) ||
            !wh__get_int(doc, "start_ns", &start) || !wh__get_int(doc, "beat_ns", &beat) ||
            pid <= 0 || gen < 0 || reads < 0 || gen_reads < 0 || start < 0 || beat < 0)
            continue; /* not a beat this build wrote: not listed */
        char host[64] = "?";
        bson_iter_t it;
        if (bson_iter_init_find(&it, doc, "host") && BSON_ITER_HOLDS_UTF8(&it))
            snprintf(host, sizeof host, "%s", bson_iter_utf8(&it, NULL));
        wh_reader_beat_t b = {0,
                              pid,
                              (uint64_t)gen,
                              (uint64_t)reads,
                              (uint64_t)gen_reads,
                              (uint64_t)start,
                              (uint64_t)beat,
                              0};
        wh_status_add_reader(o, &b, host, now);
    }
    bson_error_t e;
    bool ok = !mongoc_cursor_error(cur, &e) ||
              wh__merr(m, err, &e, "list readers in %s.readers", m->prefix);
    mongoc_cursor_destroy(cur);
    bson_destroy(&f);
    bson_destroy(&opts);
    mongoc_collection_destroy(c);
    return ok;
}
