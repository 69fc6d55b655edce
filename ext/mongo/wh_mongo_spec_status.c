/* MongoDB backend: spec mode's status (docs/reproducible.md): the state
 * document's spec part, the open generation's fill and unfinished claims,
 * and the slowest live reader. Ages are the server's ($$NOW). */
#include "wh_mongo_int.h"

/* The open generation's claims held by someone, oldest first. */
static bool wh__claims_status(wh__mongo_t *m, uint64_t g, uint64_t s, wh_spec_status_t *o,
                              wh_err_t *err) {
    const uint32_t cap = m->base.cfg.swap_cap;
    mongoc_collection_t *cc = wh__claims_coll(m, g);
    bson_t *pipe =
        BCON_NEW("pipeline", "[", "{", "$match", "{", "_id", "{", "$gte", BCON_INT32(0), "$lt",
                 BCON_INT64(cap), "}", "done", BCON_BOOL(false), "failed", BCON_BOOL(false), "tok",
                 "{", "$ne", BCON_INT64(0), "}", "}", "}", "{", "$sort", "{", "t0", BCON_INT32(1),
                 "}", "}", "{", "$limit", BCON_INT32(WH_SPEC_CLAIMS_SHOWN), "}", "{", "$project",
                 "{", "a", BCON_INT32(1), "pid", BCON_INT32(1), "host", BCON_INT32(1), "age", "{",
                 "$subtract", "[", BCON_UTF8("$$NOW"), BCON_UTF8("$t0"), "]", "}", "}", "}", "]");
    /* one batch: the pipeline's $limit bounds it */
    mongoc_cursor_t *cur = mongoc_collection_aggregate(cc, MONGOC_QUERY_NONE, pipe, NULL, NULL);
    const bson_t *d;
    while (mongoc_cursor_next(cur, &d) && o->nclaims < WH_SPEC_CLAIMS_SHOWN) {
        int64_t pos = -1, a = 0, pid = 0, age = 0;
        if (!wh__get_int(d, "_id", &pos) || pos < 0 || pos >= cap || !wh__get_int(d, "a", &a) ||
            a < 1 || a > UINT32_MAX)
            continue;
        wh__get_int(d, "pid", &pid);
        wh__get_int(d, "age", &age);
        int i = o->nclaims++;
        o->claims[i].index = s * cap + (uint64_t)pos;
        o->claims[i].pid = pid > 0 ? (uint64_t)pid : 0;
        o->claims[i].attempt = (uint32_t)a;
        o->claims[i].age_s = age > 0 ? (double)age / 1000.0 : 0.0;
        bson_iter_t it;
        if (bson_iter_init_find(&it, d, "host") && BSON_ITER_HOLDS_UTF8(&it))
            snprintf(o->claims[i].host, sizeof o->claims[i].host, "%s", bson_iter_utf8(&it, NULL));
    }
    bson_error_t e;
    bool ok = !mongoc_cursor_error(cur, &e) || wh__merr(m, err, &e, "list claims");
    mongoc_cursor_destroy(cur);
    bson_destroy(pipe);
    mongoc_collection_destroy(cc);
    return ok;
}

bool wh__mongo_spec_status(wh_store_t *st, wh_spec_status_t *o, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    wh__state_t s;
    wh__needs_t nd;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "spec status");
    if (!s.spec.on) return true;
    if (!wh__spec_needs(m, &nd, err)) return wh_err_prefix(err, "spec status");
    o->spec = true;
    o->run_seed = s.spec.run_seed;
    for (int i = 0; i < s.spec.nkept; i++) /* the newest kept */
        if (!o->any_sealed || s.spec.kept[i].s > o->last_sealed) {
            o->any_sealed = true;
            o->last_sealed = s.spec.kept[i].s;
        }
    o->floor = nd.any ? nd.min : s.spec.floor;
    o->reader = nd.any;
    o->slowest = nd.min;
    o->slowest_pid = nd.min_pid;
    o->duplicates = s.spec.dup;
    o->nondeterministic = s.spec.nondet;
    if (s.spec.open) {
        uint64_t fill = 0;
        bool full = false;
        o->open = true;
        o->open_gen = s.spec.open_s;
        if (!wh__gen_full(m, s.spec.open_g, &full, &fill, err) ||
            !wh__claims_status(m, s.spec.open_g, s.spec.open_s, o, err))
            return wh_err_prefix(err, "spec status");
        o->open_fill = (uint32_t)(fill < st->cfg.swap_cap ? fill : st->cfg.swap_cap);
    }
    if (s.spec.nfails) {
        wh_err_t f = {0};
        if (!wh__spec_fail_err(m, s.spec.fails[0].s, &f) && f.code != WH_E_SPECFAIL) {
            if (err) *err = f;
            return false;
        }
        o->failed = true;
        snprintf(o->failure, sizeof o->failure, "%s", f.message);
    }
    return true;
}
