/* MongoDB backend: spec mode's generations (docs/reproducible.md).
 *
 * Spec generation s is filled in an ordinary generation g (collections
 * <p>.gen.<g> and <p>.gen.<g>.m, the read path unchanged) with a third,
 * <p>.gen.<g>.c, beside them for its claims (wh_mongo_claim.c):
 *   {_id: "params", v, d, n, x}  the params document in force when s was
 *                                opened (version, bytes, length, XXH3)
 *   {_id: "next", n}             the positions handed out so far
 *   {_id: "fill", n}             positions committed (a hint: counted again
 *                                before a seal)
 *   {_id: <pos>, ...}            the claim of position pos
 * The state document (wh_mongo_spec_doc.c) says which s is open in which
 * g, which sealed ones are kept where, and the floor. Ids come from
 * write_gen: an open takes g = write_gen and raises it, so every id is new
 * and larger than any before, and read_gen (the newest sealed) stays below
 * write_gen as the read path expects.
 *
 * Every step is one conditional update of the state document: an open (no
 * open generation, write_gen unchanged), a seal (the open one is still g),
 * an abandon (likewise), a reclaim ($pull of kept entries). Collections
 * are dropped only after the state no longer names them, and the sweep
 * drops any generation collection below write_gen that it does not name
 * (what a killed step or a straggling put left).
 *
 * Time: every lease and liveness test in spec mode is the server's: claim
 * renewals and readers' beats are stamped with $currentDate, and compared
 * with $$NOW inside the filter that acts on them, so the hosts' clocks may
 * disagree by any amount (the manager lease compares hosts' clocks). */
#define _GNU_SOURCE
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "wh_mongo_int.h"

#define WH__LIVE_MS ((int64_t)(WH_READER_LIVE_S * 1000.0))

mongoc_collection_t *wh__claims_coll(wh__mongo_t *m, uint64_t gen) {
    char name[WH__NAME_MAX];
    snprintf(name, sizeof name, "%s.gen.%llu.c", m->prefix, (unsigned long long)gen);
    return wh__coll(m, name);
}

/* ---- small helpers ---- */

/* One update of the state document; *matched (may be NULL) whether it
 * applied. */
static bool wh__state_update(wh__mongo_t *m, const bson_t *sel, const bson_t *upd, bool *matched,
                             const char *what, wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t reply;
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, sel, upd, NULL, &reply, &e);
    int64_t n = 0;
    if (ok)
        wh__get_int(&reply, "matchedCount", &n);
    else
        wh__merr(m, err, &e, "%s", what);
    if (matched) *matched = n > 0;
    bson_destroy(&reply);
    mongoc_collection_destroy(c);
    return ok;
}

/* Drops a collection; one that does not exist is no error (the test
 * server says so without a code). */
static bool wh__drop(wh__mongo_t *m, const char *name, wh_err_t *err) {
    mongoc_collection_t *c = wh__coll(m, name);
    bson_error_t e;
    bool ok = mongoc_collection_drop_with_opts(c, NULL, &e) || e.code == 26 ||
              strstr(e.message, "ns not found") || wh__merr(m, err, &e, "drop %s", name);
    mongoc_collection_destroy(c);
    return ok;
}

bool wh__spec_counter(wh__mongo_t *m, mongoc_collection_t *cc, const char *id, int64_t below,
                      int64_t *n, bool *spent, wh_err_t *err) {
    bson_t *q = BCON_NEW("_id", BCON_UTF8(id));
    if (below > 0) BCON_APPEND(q, "n", "{", "$lt", BCON_INT64(below), "}");
    bson_t *upd = BCON_NEW("$inc", "{", "n", BCON_INT64(1), "}");
    mongoc_find_and_modify_opts_t *o = mongoc_find_and_modify_opts_new();
    mongoc_find_and_modify_opts_set_update(o, upd);
    mongoc_find_and_modify_opts_set_flags(o, MONGOC_FIND_AND_MODIFY_RETURN_NEW);
    bson_t reply;
    bson_error_t e;
    bson_iter_t it;
    bool ok = true;
    *spent = false;
    *n = 0;
    if (!mongoc_collection_find_and_modify_with_opts(cc, q, o, &reply, &e))
        ok = wh__merr(m, err, &e, "count with '%s'", id);
    else if (!bson_iter_init_find(&it, &reply, "value") || !BSON_ITER_HOLDS_DOCUMENT(&it))
        *spent = true; /* at below, or missing (the open makes it): none to give */
    else if (!wh__get_int(&reply, "value.n", n) || *n < 1 || (below > 0 && *n > below))
        ok = wh_err_set(err, WH_E_CORRUPT, "counter '%s' of a spec generation at %s holds %lld", id,
                        m->where, (long long)*n);
    bson_destroy(&reply);
    mongoc_find_and_modify_opts_destroy(o);
    bson_destroy(q);
    bson_destroy(upd);
    return ok;
}

bool wh__spec_claim_done(wh__mongo_t *m, uint64_t g, uint32_t pos, wh_err_t *err) {
    mongoc_collection_t *cc = wh__claims_coll(m, g);
    bson_t *sel = BCON_NEW("_id", BCON_INT32((int32_t)pos), "done", BCON_BOOL(false));
    bson_t *upd = BCON_NEW("$set", "{", "done", BCON_BOOL(true), "}");
    bson_error_t e;
    bool ok = mongoc_collection_update_one(cc, sel, upd, NULL, NULL, &e) ||
              wh__merr(m, err, &e, "mark the claim of position %u done", pos);
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(cc);
    return ok;
}

bool wh__spec_settle(wh__mongo_t *m, const wh__state_t *s, bool *sealed, wh_seal_info_t *info,
                     wh_err_t *err) {
    *sealed = false;
    if (!s->spec.open) return true;
    mongoc_collection_t *cc = wh__claims_coll(m, s->spec.open_g);
    bson_t *q = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt", BCON_INT64(m->base.cfg.swap_cap),
                         "}", "done", BCON_BOOL(false));
    bson_error_t e;
    int64_t undone = mongoc_collection_count_documents(cc, q, NULL, NULL, NULL, &e);
    bson_destroy(q);
    mongoc_collection_destroy(cc);
    if (undone < 0) return wh__merr(m, err, &e, "count unfinished claims");
    return undone > 0 || wh__spec_complete(m, s, sealed, info, err);
}

/* ---- the readers' needs ---- */

bool wh__spec_needs(wh__mongo_t *m, wh__needs_t *nd, wh_err_t *err) {
    memset(nd, 0, sizeof *nd);
    mongoc_collection_t *c = wh__readers_coll(m);
    /* live: beat (at, the server's clock) within WH_READER_LIVE_S of the
     * server's now */
    bson_t *f = BCON_NEW("need", "{", "$gte", BCON_INT64(0), "}", "$expr", "{", "$gte", "[",
                         BCON_UTF8("$at"), "{", "$subtract", "[", BCON_UTF8("$$NOW"),
                         BCON_INT64(WH__LIVE_MS), "]", "}", "]", "}");
    bson_t *opts = BCON_NEW("projection", "{", "need", BCON_INT32(1), "pid", BCON_INT32(1), "}",
                            "sort", "{", "need", BCON_INT32(1), "}", "batchSize", BCON_INT32(1024),
                            "limit", BCON_INT64(1024));
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, f, opts, NULL);
    const bson_t *doc;
    while (mongoc_cursor_next(cur, &doc)) {
        int64_t s = -1, pid = 0;
        if (!wh__get_int(doc, "need", &s) || s < 0) continue; /* not a need this build wrote */
        wh__get_int(doc, "pid", &pid);
        if (!nd->any || (uint64_t)s < nd->min) {
            nd->min = (uint64_t)s;
            nd->min_pid = pid > 0 ? (uint64_t)pid : 0;
        }
        nd->any = true;
        bool seen = false;
        for (int i = 0; i < nd->n && !seen; i++) seen = nd->s[i] == (uint64_t)s;
        if (!seen && nd->n < WH__NEEDS) nd->s[nd->n++] = (uint64_t)s;
    }
    bson_error_t e;
    bool ok = !mongoc_cursor_error(cur, &e) ||
              wh__merr(m, err, &e, "read the spec readers' needs in %s.readers", m->prefix);
    mongoc_cursor_destroy(cur);
    bson_destroy(f);
    bson_destroy(opts);
    mongoc_collection_destroy(c);
    return ok;
}

uint64_t wh__spec_floor(wh__mongo_t *m, const wh__state_t *s, const wh__needs_t *nd) {
    if (!nd->any) return s->spec.floor;
    if (nd->min != s->spec.floor) { /* best effort: the floor matters only without readers */
        bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"));
        bson_t *upd = BCON_NEW("$set", "{", "spec.floor", BCON_INT64((int64_t)nd->min), "}");
        wh__state_update(m, sel, upd, NULL, "persist the spec floor", NULL);
        bson_destroy(sel);
        bson_destroy(upd);
    }
    return nd->min;
}

/* ---- a generation's params copy ---- */

/* The params document copied for generation g: *found, its version *v,
 * and (doc not NULL) the text, malloc'd and NUL-terminated. */
static bool wh__params_copy(wh__mongo_t *m, uint64_t g, bool *found, uint64_t *v, char **doc,
                            size_t *len, wh_err_t *err) {
    mongoc_collection_t *cc = wh__claims_coll(m, g);
    bson_t *q = BCON_NEW("_id", BCON_UTF8("params"));
    bson_t d = BSON_INITIALIZER;
    bool ok = wh__find_one(m, cc, q, &d, found, "read a generation's params", err);
    if (ok && *found) {
        int64_t pv = -1, n = -1, x = 0;
        const uint8_t *bytes = NULL;
        uint32_t blen = 0;
        bson_iter_t it;
        if (bson_iter_init_find(&it, &d, "d") && BSON_ITER_HOLDS_BINARY(&it))
            bson_iter_binary(&it, NULL, &blen, &bytes);
        if (!wh__get_int(&d, "v", &pv) || !wh__get_int(&d, "n", &n) || !wh__get_int(&d, "x", &x) ||
            !bytes || pv < 0 || n < 0 || n > WH_PARAMS_MAX || (uint64_t)n != blen ||
            XXH3_64bits(bytes, blen) != (uint64_t)x) {
            ok = wh_err_set(err, WH_E_CORRUPT,
                            "the params copy of generation %llu at %s (collection prefix '%s') "
                            "fails its check: version, length (at most %u bytes) or checksum",
                            (unsigned long long)g, m->where, m->prefix, WH_PARAMS_MAX);
        } else {
            *v = (uint64_t)pv;
            if (doc) {
                *doc = malloc(blen + 1);
                if (!*doc) {
                    ok = wh_err_set(err, WH_E_SYS, "out of memory");
                } else {
                    memcpy(*doc, bytes, blen);
                    (*doc)[blen] = '\0';
                    *len = blen;
                }
            }
        }
    }
    bson_destroy(&d);
    bson_destroy(q);
    mongoc_collection_destroy(cc);
    return ok;
}

/* ---- open, seal, abandon, reclaim ---- */

bool wh__spec_open(wh__mongo_t *m, const wh__state_t *s, uint64_t spec_gen, wh_err_t *err) {
    const uint64_t g = s->write_gen;
    /* The params in force, copied beside the claims first: every generator
     * of g gets exactly this document, whatever set_params does later. A
     * racing opener of the same g finds the copy and records its version. */
    uint64_t pv = 0;
    char *doc = NULL;
    size_t len = 0;
    if (!wh__mongo_params_get(&m->base, &pv, &doc, &len, err)) return false;
    mongoc_collection_t *cc = wh__claims_coll(m, g);
    bson_t d = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&d, "_id", "params");
    BSON_APPEND_INT64(&d, "v", (int64_t)pv);
    BSON_APPEND_BINARY(&d, "d", BSON_SUBTYPE_BINARY, (const uint8_t *)doc, (uint32_t)len);
    BSON_APPEND_INT64(&d, "n", (int64_t)len);
    BSON_APPEND_INT64(&d, "x", (int64_t)XXH3_64bits(doc, len));
    free(doc);
    bson_error_t e;
    bool ok = true, dup = false;
    if (!mongoc_collection_insert_one(cc, &d, NULL, NULL, &e)) {
        dup = wh__is_dup(&e);
        if (!dup)
            ok = wh__merr(m, err, &e, "copy params for generation %llu", (unsigned long long)g);
    }
    bson_destroy(&d);
    /* and the counters, which claims and puts only raise */
    static const char *const ctr[] = {"next", "fill"};
    for (int i = 0; ok && i < 2; i++) {
        bson_t *c0 = BCON_NEW("_id", BCON_UTF8(ctr[i]), "n", BCON_INT64(0));
        if (!mongoc_collection_insert_one(cc, c0, NULL, NULL, &e) && !wh__is_dup(&e))
            ok = wh__merr(m, err, &e, "make a counter of generation %llu", (unsigned long long)g);
        bson_destroy(c0);
    }
    mongoc_collection_destroy(cc);
    bool found = false;
    if (ok && dup) ok = wh__params_copy(m, g, &found, &pv, NULL, NULL, err);
    if (!ok) return false;
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"), "write_gen", BCON_INT64((int64_t)g),
                           "spec.open", "{", "$exists", BCON_BOOL(false), "}");
    bson_t *upd = BCON_NEW("$set", "{", "spec.open", "{", "s", BCON_INT64((int64_t)spec_gen), "g",
                           BCON_INT64((int64_t)g), "pv", BCON_INT64((int64_t)pv), "t",
                           BCON_INT64((int64_t)wh_now_real_ns()), "}", "write_gen",
                           BCON_INT64((int64_t)g + 1), "}");
    ok = wh__state_update(m, sel, upd, NULL, "open a spec generation", err);
    bson_destroy(sel);
    bson_destroy(upd);
    return ok; /* applied or not, the caller reads the state again */
}

bool wh__spec_complete(wh__mongo_t *m, const wh__state_t *s, bool *sealed, wh_seal_info_t *info,
                       wh_err_t *err) {
    *sealed = false;
    if (!s->spec.open) return true;
    const uint64_t g = s->spec.open_g, sg = s->spec.open_s, cap = m->base.cfg.swap_cap;
    uint64_t t0 = wh_now_mono_ns(), fill = 0;
    bool full = false;
    if (!wh__gen_full(m, g, &full, &fill, err)) return false;
    if (!full) return true;
    uint64_t seal_ns = wh_now_mono_ns() - t0, generated = s->generated + cap;
    /* The seal: the open generation becomes a kept one in one update,
     * conditional on its still being the open one. */
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"), "spec.open.g", BCON_INT64((int64_t)g));
    bson_t *upd = BCON_NEW(
        "$unset", "{", "spec.open", BCON_UTF8(""), "}", "$max", "{", "read_gen",
        BCON_INT64((int64_t)g), "}", "$inc", "{", "seals", BCON_INT64(1), "generated",
        BCON_INT64((int64_t)cap), "}", "$push", "{", "spec.kept", "{", "$each", "[", "{", "s",
        BCON_INT64((int64_t)sg), "g", BCON_INT64((int64_t)g), "}", "]", "$slice",
        BCON_INT32(-WH__SPEC_KEPT), "}", "history", "{", "$each", "[", "{", "generation",
        BCON_INT64((int64_t)g), "time_ns", BCON_INT64((int64_t)wh_now_real_ns()), "generated",
        BCON_INT64((int64_t)generated), "discarded", BCON_INT64((int64_t)s->discarded), "seal_ns",
        BCON_INT64((int64_t)seal_ns), "}", "]", "$slice", BCON_INT32(-WH__HIST), "}", "}");
    bool ok = wh__state_update(m, sel, upd, sealed, "seal a spec generation", err);
    bson_destroy(sel);
    bson_destroy(upd);
    if (!ok)
        return wh_err_prefix(err, "spec generation %llu (generation %llu)", (unsigned long long)sg,
                             (unsigned long long)g);
    if (*sealed) {
        if (g > m->known_read) m->known_read = g;
        if (info) {
            memset(info, 0, sizeof *info);
            info->generation = g;
            info->generated = generated;
            info->discarded = s->discarded;
            info->seal_ns = seal_ns;
        }
    }
    return true;
}

/* Generation id of a collection name "<prefix>.gen.<g>[.m|.c]" (0: not one). */
static uint64_t wh__gen_of(const wh__mongo_t *m, const char *name) {
    char pre[WH__NAME_MAX];
    int plen = snprintf(pre, sizeof pre, "%s.gen.", m->prefix);
    if (strncmp(name, pre, (size_t)plen) != 0) return 0;
    const char *num = name + plen;
    size_t digits = strspn(num, "0123456789");
    if (!digits || digits > 19) return 0;
    const char *end = num + digits;
    if (*end && strcmp(end, ".m") != 0 && strcmp(end, ".c") != 0) return 0;
    errno = 0;
    unsigned long long g = strtoull(num, NULL, 10);
    return errno ? 0 : (uint64_t)g;
}

/* Drops every generation collection below write_gen that the state names
 * neither as kept nor as open: nothing can make such a g live again (opens
 * take new ids, seals only the open one). */
static bool wh__spec_sweep(wh__mongo_t *m, wh_err_t *err) {
    wh__state_t now;
    bool exists = false, ok = true;
    if (!wh__state_get(m, false, &now, &exists, err)) return false;
    if (!exists) return true;
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    char **names = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    if (!names) return wh__merr(m, err, &e, "list collections");
    for (char **p = names; *p && ok; p++) {
        uint64_t gen = wh__gen_of(m, *p);
        if (gen && gen < now.write_gen && !wh__spec_holds(&now.spec, gen))
            ok = wh__drop(m, *p, err);
    }
    bson_strfreev(names);
    return ok;
}

bool wh__spec_abandon(wh__mongo_t *m, const wh__state_t *s, wh_err_t *err) {
    if (!s->spec.open) return true;
    const uint64_t g = s->spec.open_g;
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"), "spec.open.g", BCON_INT64((int64_t)g));
    bson_t *upd = BCON_NEW("$unset", "{", "spec.open", BCON_UTF8(""), "}");
    bool done = false;
    bool ok = wh__state_update(m, sel, upd, &done, "abandon a spec generation", err);
    bson_destroy(sel);
    bson_destroy(upd);
    /* its claims and samples go with it: renewals and puts find it gone */
    return ok && (!done || wh__spec_sweep(m, err));
}

bool wh__spec_reclaim(wh__mongo_t *m, const wh__state_t *s, const wh__needs_t *nd, uint64_t floor,
                      wh_err_t *err) {
    /* sealed generations outside the window that no live reader reads now */
    bson_t sel = BSON_INITIALIZER, upd = BSON_INITIALIZER, pull, kept, g, in;
    BSON_APPEND_UTF8(&sel, "_id", "state");
    BSON_APPEND_DOCUMENT_BEGIN(&upd, "$pull", &pull);
    BSON_APPEND_DOCUMENT_BEGIN(&pull, "spec.kept", &kept);
    BSON_APPEND_DOCUMENT_BEGIN(&kept, "g", &g);
    BSON_APPEND_ARRAY_BEGIN(&g, "$in", &in);
    int nvict = 0;
    for (int i = 0; i < s->spec.nkept; i++) {
        uint64_t ks = s->spec.kept[i].s;
        bool needed = ks >= floor && ks < floor + WH_SPEC_AHEAD;
        for (int j = 0; j < nd->n && !needed; j++) needed = nd->s[j] == ks;
        if (needed) continue;
        char key[16];
        const char *k;
        bson_uint32_to_string((uint32_t)nvict++, &k, key, sizeof key);
        BSON_APPEND_INT64(&in, k, (int64_t)s->spec.kept[i].g);
    }
    bson_append_array_end(&g, &in);
    bson_append_document_end(&kept, &g);
    bson_append_document_end(&pull, &kept);
    bson_append_document_end(&upd, &pull);
    bool ok = !nvict || wh__state_update(m, &sel, &upd, NULL, "reclaim spec generations", err);
    bson_destroy(&sel);
    bson_destroy(&upd);
    return ok && wh__spec_sweep(m, err);
}

/* ---- failures ---- */

bool wh__spec_record_fail(wh__mongo_t *m, uint64_t s, uint64_t k, const char *msg, wh_err_t *err) {
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"), "spec.fails.k", "{", "$ne",
                           BCON_INT64((int64_t)k), "}");
    bson_t *upd = BCON_NEW("$push", "{", "spec.fails", "{", "$each", "[", "{", "s",
                           BCON_INT64((int64_t)s), "k", BCON_INT64((int64_t)k), "m", BCON_UTF8(msg),
                           "}", "]", "$slice", BCON_INT32(WH__SPEC_FAILS), "}", "}");
    bool ok = wh__state_update(m, sel, upd, NULL, "record a failed sample index", err);
    bson_destroy(sel);
    bson_destroy(upd);
    return ok;
}

bool wh__spec_fail_err(wh__mongo_t *m, uint64_t s, wh_err_t *err) {
    char msg[WH_ERR_LEN];
    snprintf(msg, sizeof msg, "spec generation %llu has a sample index that failed every attempt",
             (unsigned long long)s);
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *q = BCON_NEW("_id", BCON_UTF8("state"));
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, c, q, &doc, &found, "read store state", err);
    bson_iter_t it, arr;
    if (ok && found && bson_iter_init(&it, &doc) &&
        bson_iter_find_descendant(&it, "spec.fails", &it) && BSON_ITER_HOLDS_ARRAY(&it) &&
        bson_iter_recurse(&it, &arr)) {
        while (bson_iter_next(&arr)) {
            if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) continue;
            uint32_t len;
            const uint8_t *data;
            bson_iter_document(&arr, &len, &data);
            bson_t one;
            bson_iter_t mi;
            int64_t fs = -1;
            if (!bson_init_static(&one, data, len) || !wh__get_int(&one, "s", &fs) ||
                (uint64_t)fs != s)
                continue;
            if (bson_iter_init_find(&mi, &one, "m") && BSON_ITER_HOLDS_UTF8(&mi))
                snprintf(msg, sizeof msg, "%s", bson_iter_utf8(&mi, NULL));
            break;
        }
    }
    bson_destroy(&doc);
    bson_destroy(q);
    mongoc_collection_destroy(c);
    if (!ok) return false;
    return wh_err_set(err, WH_E_SPECFAIL, "%s", msg);
}

/* ---- the operations over these ---- */

bool wh__mongo_spec_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "seal");
    return wh__spec_settle(m, &s, sealed, info, err);
}

bool wh__mongo_spec_locate(wh_store_t *st, uint64_t sg, uint64_t *gen, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "locate");
    if (wh__spec_failed(&s.spec, sg)) return wh__spec_fail_err(m, sg, err);
    uint64_t g = 0;
    *gen = wh__spec_kept(&s.spec, sg, &g) ? g : 0;
    return true;
}

bool wh__mongo_spec_need(wh_store_t *st, uint64_t sg, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    uint64_t now = wh_now_mono_ns();
    /* a new need is published at once; the same one again with the beat's pace */
    if (m->need_sent && m->need_s == sg &&
        now - m->need_ns < (uint64_t)(WH_READER_BEAT_MONGO_S * 1e9))
        return true;
    mongoc_collection_t *c = wh__readers_coll(m);
    bson_t *q = BCON_NEW("_id", BCON_INT64((int64_t)(st->beat.token >> 1)));
    bson_t *u =
        BCON_NEW("$set", "{", "need", BCON_INT64((int64_t)sg), "pid", BCON_INT64((int64_t)m->pid),
                 "host", BCON_UTF8(m->host), "beat_ns", BCON_INT64((int64_t)wh_now_real_ns()), "}",
                 "$currentDate", "{", "at", BCON_BOOL(true), "}");
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, q, u, opts, NULL, &e) ||
              wh__merr(m, err, &e, "publish the need of spec generation %llu in %s.readers",
                       (unsigned long long)sg, m->prefix);
    if (ok) {
        m->need_sent = true;
        m->need_s = sg;
        m->need_ns = now;
    }
    bson_destroy(q);
    bson_destroy(u);
    bson_destroy(opts);
    mongoc_collection_destroy(c);
    return ok;
}

bool wh__mongo_spec_params(wh_store_t *st, const wh_claim_t *c, char **doc, size_t *len,
                           wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    bool found = false;
    uint64_t v = 0;
    if (!wh__params_copy(m, c->gen, &found, &v, doc, len, err)) return false;
    if (!found) return wh_store_err_gone(err, c->gen);
    if (v != c->params_version) {
        free(*doc);
        *doc = NULL;
        return wh_err_set(err, WH_E_CORRUPT,
                          "generation %llu holds params version %llu, its claim says %llu",
                          (unsigned long long)c->gen, (unsigned long long)v,
                          (unsigned long long)c->params_version);
    }
    return true;
}
