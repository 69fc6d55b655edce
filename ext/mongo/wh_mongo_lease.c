/* MongoDB backend: the manager lease and the seal (the atomic swap and
 * the sweep of old generations). */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* ---- manager: lease and seal ---- */

/* A lease document no manager could have written: expires not a number,
 * or further ahead than its holder's lease_ms (at most WH_SECONDS_MAX)
 * allows. Left alone it would stop every manager from leading. */
static bool wh__lease_forged(const bson_t *doc, int64_t now_ms) {
    const int64_t max_ms = (int64_t)(WH_SECONDS_MAX * 1e3);
    int64_t exp = 0, len = 0;
    if (!wh__get_int(doc, "expires", &exp)) return true;
    if (!wh__get_int(doc, "lease_ms", &len) || len < 0 || len > max_ms) len = max_ms;
    return exp > now_ms + len + 1000;
}

/* Removes the lease document if it is still the forged one we read (the
 * filter matches its owner and expires exactly, so a real manager's fresh
 * lease is never removed). */
static bool wh__drop_forged_lease(wh__mongo_t *m, mongoc_collection_t *c, const bson_t *doc,
                                  wh_err_t *err) {
    bson_t sel = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&sel, "_id", "lease");
    bson_iter_t it;
    if (bson_iter_init_find(&it, doc, "expires")) {
        bson_append_iter(&sel, "expires", -1, &it);
    } else {
        bson_t ex;
        BSON_APPEND_DOCUMENT_BEGIN(&sel, "expires", &ex);
        BSON_APPEND_BOOL(&ex, "$exists", false);
        bson_append_document_end(&sel, &ex);
    }
    if (bson_iter_init_find(&it, doc, "owner")) bson_append_iter(&sel, "owner", -1, &it);
    bson_error_t e;
    bool ok = mongoc_collection_delete_one(c, &sel, NULL, NULL, &e);
    bson_destroy(&sel);
    return ok || wh__merr(m, err, &e, "remove a forged manager lease");
}

bool wh__mongo_lead(wh_store_t *st, bool *leader, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    int64_t now = (int64_t)(wh_now_real_ns() / 1000000);
    int64_t len = (int64_t)(st->cfg.lease_s * 1000.0), exp = now + len;
    mongoc_collection_t *c = wh__state_coll(m);
    /* ours, or expired, or absent (the upsert inserts it); a live lease of
     * another owner makes the upsert collide on _id */
    bson_t *sel =
        BCON_NEW("_id", BCON_UTF8("lease"), "$or", "[", "{", "owner", BCON_INT64((int64_t)m->token),
                 "}", "{", "expires", "{", "$lt", BCON_INT64(now), "}", "}", "]");
    bson_t *upd = BCON_NEW("$set", "{", "owner", BCON_INT64((int64_t)m->token), "expires",
                           BCON_INT64(exp), "lease_ms", BCON_INT64(len), "pid",
                           BCON_INT64((int64_t)m->pid), "host", BCON_UTF8(m->host), "}");
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
    bool ok = true;
    *leader = false;
    for (int attempt = 0; ok && attempt < 2; attempt++) {
        bson_t reply;
        bson_error_t e;
        bool done = mongoc_collection_update_one(c, sel, upd, opts, &reply, &e);
        if (done) {
            int64_t matched = 0;
            wh__get_int(&reply, "matchedCount", &matched);
            bson_iter_t it;
            *leader = matched > 0 || bson_iter_init_find(&it, &reply, "upsertedId");
        } else if (!wh__is_dup(&e)) {
            ok = wh__merr(m, err, &e, "acquire manager lease");
        }
        bson_destroy(&reply);
        if (done || !ok) break;
        /* held by another: a real lease, or one no manager could have written */
        bson_t q = BSON_INITIALIZER, doc = BSON_INITIALIZER;
        BSON_APPEND_UTF8(&q, "_id", "lease");
        bool found = false;
        ok = wh__find_one(m, c, &q, &doc, &found, "read manager lease", err);
        bool forged = ok && found && wh__lease_forged(&doc, now);
        if (forged) ok = wh__drop_forged_lease(m, c, &doc, err);
        bson_destroy(&q);
        bson_destroy(&doc);
        if (!forged) break;
    }
    bson_destroy(sel);
    bson_destroy(upd);
    bson_destroy(opts);
    mongoc_collection_destroy(c);
    return ok;
}

bool wh__mongo_resign(wh_store_t *st, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("lease"), "owner", BCON_INT64((int64_t)m->token));
    bson_error_t e;
    bool ok = mongoc_collection_delete_one(c, sel, NULL, NULL, &e);
    if (!ok) wh__merr(m, err, &e, "give up manager lease");
    bson_destroy(sel);
    mongoc_collection_destroy(c);
    return ok;
}

/* The lease document; *live false when absent or expired. */
bool wh__lease_get(wh__mongo_t *m, uint64_t *owner, uint64_t *pid, int64_t *left_ms, bool *live,
                   wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *filter = BCON_NEW("_id", BCON_UTF8("lease"));
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, c, filter, &doc, &found, "read manager lease", err);
    *live = false;
    if (ok && found) {
        int64_t exp = 0, o = 0, p = 0;
        int64_t now = (int64_t)(wh_now_real_ns() / 1000000);
        wh__get_int(&doc, "owner", &o);
        wh__get_int(&doc, "pid", &p);
        if (wh__get_int(&doc, "expires", &exp) && exp >= now) {
            *live = true;
            *owner = (uint64_t)o;
            *pid = p > 0 ? (uint64_t)p : 1;
            *left_ms = exp - now;
        }
    }
    bson_destroy(&doc);
    bson_destroy(filter);
    mongoc_collection_destroy(c);
    return ok;
}

/* Drops generation collections older than keep_from except keep (the
 * retiring generation). Also catches collections a stale writer recreated. */
static bool wh__sweep(wh__mongo_t *m, uint64_t keep_from, uint64_t keep, wh_err_t *err) {
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    char **names = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    if (!names) return wh__merr(m, err, &e, "list collections");
    char pre[WH__NAME_MAX];
    int plen = snprintf(pre, sizeof pre, "%s.gen.", m->prefix);
    bool ok = true;
    for (char **p = names; *p; p++) {
        if (strncmp(*p, pre, (size_t)plen) != 0) continue;
        const char *num = *p + plen;
        char *end;
        errno = 0;
        unsigned long long g = strtoull(num, &end, 10);
        if (errno || end == num || (*end && strcmp(end, ".m") != 0)) continue;
        if (g >= keep_from || g == keep) continue;
        mongoc_collection_t *c = wh__coll(m, *p);
        if (!mongoc_collection_drop_with_opts(c, NULL, &e) && e.code != 26 &&
            !strstr(e.message, "ns not found") && ok)
            ok = wh__merr(m, err, &e, "drop generation %llu", g);
        mongoc_collection_destroy(c);
    }
    bson_strfreev(names);
    return ok;
}

bool wh__mongo_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    *sealed = false;
    uint64_t t0 = wh_now_mono_ns();
    uint64_t owner = 0, pid = 0;
    int64_t left = 0;
    bool live = false;
    if (!wh__lease_get(m, &owner, &pid, &left, &live, err)) return wh_err_prefix(err, "seal");
    if (!live || owner != m->token)
        return wh_err_set(err, WH_E_LEASE, "seal: this manager does not hold the lease");
    /* spec mode: its generations seal themselves; a manager's seal completes one whose last
     * put died before sealing, and never sweeps (what it keeps is the readers' to say) */
    if (st->cfg.spec) return wh__mongo_spec_seal(st, sealed, info, err);
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "seal");
    uint64_t w = s.write_gen;
    bool full = false;
    if (!wh__gen_full(m, w, &full, NULL, err))
        return wh_err_prefix(err, "seal generation %llu", (unsigned long long)w);
    if (!full) return true;

    uint64_t cap = st->cfg.swap_cap;
    uint64_t seal_ns = wh_now_mono_ns() - t0;
    uint64_t generated = s.generated + cap;
    mongoc_collection_t *c = wh__state_coll(m);
    /* The swap: one single-document update, conditional on nobody having
     * sealed w meanwhile. A sealer killed at any point leaves a state as
     * good as the old or the new one: the server applies this update whole
     * or not at all (read_gen, write_gen, retiring and the counters are one
     * document); the write generation's collection needs no preparing (puts
     * create it, and no collection of a generation newer than write_gen can
     * exist); and each drop of the sweep below stands alone, the next
     * seal's sweep dropping whatever a killed one left. */
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"), "write_gen", BCON_INT64((int64_t)w));
    bson_t *upd = BCON_NEW(
        "$set", "{", "read_gen", BCON_INT64((int64_t)w), "write_gen", BCON_INT64((int64_t)w + 1),
        "retiring", BCON_INT64((int64_t)s.read_gen), "}", "$inc", "{", "seals", BCON_INT64(1),
        "generated", BCON_INT64((int64_t)cap), "}", "$push", "{", "history", "{", "$each", "[", "{",
        "generation", BCON_INT64((int64_t)w), "time_ns", BCON_INT64((int64_t)wh_now_real_ns()),
        "generated", BCON_INT64((int64_t)generated), "discarded", BCON_INT64((int64_t)s.discarded),
        "seal_ns", BCON_INT64((int64_t)seal_ns), "}", "]", "$slice", BCON_INT32(-WH__HIST), "}",
        "}");
    bson_t reply;
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, sel, upd, NULL, &reply, &e);
    int64_t matched = 0;
    if (ok)
        wh__get_int(&reply, "matchedCount", &matched);
    else
        wh__merr(m, err, &e, "seal generation %llu", (unsigned long long)w);
    bson_destroy(&reply);
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(c);
    if (!ok) return false;
    if (matched != 1) return true; /* sealed by someone else, or wiped */
    if (w > m->known_read) m->known_read = w;
    *sealed = true;
    info->generation = w;
    info->generated = generated;
    info->discarded = s.discarded;
    info->seal_ns = seal_ns;
    /* Reclaim: keep w (read), s.read_gen (retiring), w+1 (write). A failure
     * here is retried by the next seal's sweep; the seal itself stands. */
    wh_fault_seal_midway();
    wh_err_t ignored;
    wh__sweep(m, w, s.read_gen, &ignored);
    return true;
}
