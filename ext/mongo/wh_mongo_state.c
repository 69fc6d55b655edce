/* MongoDB backend: the state document (schema, generations, history) and
 * how full a generation is. */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* ---- state document ---- */

static void wh__append_schema(bson_t *doc, const wh_store_config_t *cfg) {
    bson_t sch, names;
    BSON_APPEND_DOCUMENT_BEGIN(doc, "schema", &sch);
    BSON_APPEND_INT32(&sch, "version", WH_FORMAT_VERSION);
    BSON_APPEND_INT64(&sch, "hash", (int64_t)cfg->schema.hash);
    BSON_APPEND_ARRAY_BEGIN(&sch, "names", &names);
    for (int i = 0; i < cfg->schema.nfields; i++) {
        char key[16];
        const char *k;
        bson_uint32_to_string((uint32_t)i, &k, key, sizeof key);
        BSON_APPEND_UTF8(&names, k, cfg->schema.names[i]);
    }
    bson_append_array_end(&sch, &names);
    bson_append_document_end(doc, &sch);
    BSON_APPEND_INT64(doc, "swap_cap", cfg->swap_cap);
}

static bool wh__check_schema(const wh__mongo_t *m, const bson_t *doc, wh_err_t *err) {
    const wh_store_config_t *cfg = &m->base.cfg;
    int64_t ver = 0, hash = 0, cap = 0;
    if (!wh__get_int(doc, "schema.version", &ver) || !wh__get_int(doc, "schema.hash", &hash) ||
        !wh__get_int(doc, "swap_cap", &cap))
        return wh_err_set(err, WH_E_CORRUPT,
                          "collection prefix '%s' at %s: state document lacks its schema",
                          m->prefix, m->where);
    if (ver != WH_FORMAT_VERSION)
        return wh_err_set(err, WH_E_SCHEMA,
                          "collection prefix '%s' at %s has format version %lld, this build "
                          "uses %d; remove it with `wirehead-torch clean` or wt.clean(config)",
                          m->prefix, m->where, (long long)ver, WH_FORMAT_VERSION);
    if ((uint64_t)hash != cfg->schema.hash) {
        char have[WH_MAX_FIELDS * (WH_MAX_NAME + 2)] = "";
        bson_iter_t it, arr;
        if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "schema.names", &it) &&
            BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
            size_t k = 0;
            while (bson_iter_next(&arr) && k < sizeof have - 1) {
                if (!BSON_ITER_HOLDS_UTF8(&arr)) continue;
                k += (size_t)snprintf(have + k, sizeof have - k, "%s%s", k ? ", " : "",
                                      bson_iter_utf8(&arr, NULL));
            }
        }
        char want[WH_MAX_FIELDS * (WH_MAX_NAME + 2)] = "";
        size_t w = 0;
        for (int i = 0; i < cfg->schema.nfields && i < WH_MAX_FIELDS && w < sizeof want - 1; i++)
            w += (size_t)snprintf(want + w, sizeof want - w, "%s%s", i ? ", " : "",
                                  cfg->schema.names[i]);
        return wh_err_set(err, WH_E_SCHEMA,
                          "collection prefix '%s' at %s was created with SAMPLE [%s], the "
                          "config's SAMPLE is [%s]; use another COLLECTION_PREFIX (or "
                          "WRITE_COLLECTION), or `wirehead-torch clean` or wt.clean(config)",
                          m->prefix, m->where, have, want);
    }
    if ((uint64_t)cap != cfg->swap_cap)
        return wh_err_set(err, WH_E_SCHEMA,
                          "collection prefix '%s' at %s was created with SWAP_CAP=%lld, config "
                          "says %u; use another COLLECTION_PREFIX (or WRITE_COLLECTION), or "
                          "`wirehead-torch clean` or wt.clean(config)",
                          m->prefix, m->where, (long long)cap, cfg->swap_cap);
    return true;
}

static void wh__parse_state(const bson_t *doc, wh__state_t *s) {
    memset(s, 0, sizeof *s);
    s->read_gen = wh__get_u64_or0(doc, "read_gen");
    s->write_gen = wh__get_u64_or0(doc, "write_gen");
    s->retiring = wh__get_u64_or0(doc, "retiring");
    s->seals = wh__get_u64_or0(doc, "seals");
    s->generated = wh__get_u64_or0(doc, "generated");
    s->discarded = wh__get_u64_or0(doc, "discarded");
    s->last_put_ns = wh__get_u64_or0(doc, "last_put");
    bson_iter_t it, arr;
    if (bson_iter_init_find(&it, doc, "history") && BSON_ITER_HOLDS_ARRAY(&it) &&
        bson_iter_recurse(&it, &arr)) {
        while (bson_iter_next(&arr) && s->nhist < WH__HIST) {
            if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) continue;
            uint32_t len;
            const uint8_t *data;
            bson_iter_document(&arr, &len, &data);
            bson_t h;
            if (!bson_init_static(&h, data, len)) continue;
            int k = s->nhist++;
            s->hist[k].generation = wh__get_u64_or0(&h, "generation");
            s->hist[k].time_ns = wh__get_u64_or0(&h, "time_ns");
            s->hist[k].generated = wh__get_u64_or0(&h, "generated");
            s->hist[k].discarded = wh__get_u64_or0(&h, "discarded");
            s->hist[k].seal_ns = wh__get_u64_or0(&h, "seal_ns");
        }
    }
}

/* Reads the state document, creating it when missing (first use, or a wiped
 * database) if create is set; *exists false when missing and not created. */
bool wh__state_get(wh__mongo_t *m, bool create, wh__state_t *s, bool *exists, wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t filter = BSON_INITIALIZER, doc = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&filter, "_id", "state");
    bool ok = true, found = false;
    for (int attempt = 0; ok && attempt < 3; attempt++) {
        ok = wh__find_one(m, c, &filter, &doc, &found, "read store state", err);
        if (!ok || found || !create) break;
        /* Generation ids start at the wall clock in nanoseconds: larger
         * than any id the store had before it was wiped. */
        uint64_t g0 = wh_now_real_ns();
        bson_t init = BSON_INITIALIZER, hist;
        BSON_APPEND_UTF8(&init, "_id", "state");
        BSON_APPEND_INT64(&init, "read_gen", 0);
        BSON_APPEND_INT64(&init, "write_gen", (int64_t)g0);
        BSON_APPEND_INT64(&init, "retiring", 0);
        BSON_APPEND_INT64(&init, "seals", 0);
        BSON_APPEND_INT64(&init, "generated", 0);
        BSON_APPEND_INT64(&init, "discarded", 0);
        BSON_APPEND_ARRAY_BEGIN(&init, "history", &hist);
        bson_append_array_end(&init, &hist);
        wh__append_schema(&init, &m->base.cfg);
        wh__spec_append(&init, &m->base.cfg);
        BSON_APPEND_INT64(&init, "created_ns", (int64_t)wh_now_real_ns());
        bson_error_t e;
        if (!mongoc_collection_insert_one(c, &init, NULL, NULL, &e) && !wh__is_dup(&e))
            ok = wh__merr(m, err, &e, "create store state");
        bson_destroy(&init);
        /* inserted, or someone else created it first: read it back */
    }
    if (ok && create && !found)
        ok = wh_err_set(err, WH_E_INTERNAL, "store state document keeps disappearing at %s",
                        m->where);
    if (ok && found) ok = wh__check_schema(m, &doc, err) && wh__spec_check(m, &doc, err);
    if (ok) {
        if (found)
            wh__parse_state(&doc, s);
        else
            memset(s, 0, sizeof *s);
        if (found) ok = wh__spec_parse(m, &doc, &s->spec, err);
        if (found && (s->write_gen == 0 || s->read_gen >= s->write_gen))
            ok = wh_err_set(err, WH_E_CORRUPT,
                            "collection prefix '%s' at %s: state document "
                            "is inconsistent (read %llu, write %llu)",
                            m->prefix, m->where, (unsigned long long)s->read_gen,
                            (unsigned long long)s->write_gen);
        if (ok && found && s->read_gen > m->known_read) m->known_read = s->read_gen;
        if (ok && found) { /* the params version a set published (wh_mongo_params.c) */
            uint64_t pv = wh__get_u64_or0(&doc, "params_version");
            if (pv > m->pv_hint) m->pv_hint = pv;
        }
    }
    if (exists) *exists = found;
    bson_destroy(&doc);
    bson_destroy(&filter);
    mongoc_collection_destroy(c);
    return ok;
}

bool wh__inc_discarded(wh__mongo_t *m, wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"));
    bson_t *upd = BCON_NEW("$inc", "{", "discarded", BCON_INT64(1), "}", "$max", "{", "last_put",
                           BCON_INT64((int64_t)wh_now_real_ns()), "}");
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, sel, upd, NULL, NULL, &e);
    if (!ok) wh__merr(m, err, &e, "count a discarded sample");
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(c);
    return ok;
}

/* ---- generation fill ---- */

/* Number of manifests in generation gen (positions 0..swap_cap-1). */
static bool wh__count_manifests(wh__mongo_t *m, uint64_t gen, uint64_t *n, wh_err_t *err) {
    mongoc_collection_t *c = wh__gen_coll(m, gen, true);
    bson_t *filter = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt",
                              BCON_INT64((int64_t)m->base.cfg.swap_cap), "}");
    bson_error_t e;
    int64_t k = mongoc_collection_count_documents(c, filter, NULL, NULL, NULL, &e);
    bson_destroy(filter);
    mongoc_collection_destroy(c);
    if (k < 0)
        return wh__merr(m, err, &e, "count samples of generation %llu", (unsigned long long)gen);
    *n = (uint64_t)k;
    return true;
}

/* Value of the position counter of gen (0 when it does not exist yet) and
 * when a put last claimed a position from it (t; 0 when none did). */
static bool wh__counter_t(wh__mongo_t *m, uint64_t gen, uint64_t *n, uint64_t *t, wh_err_t *err) {
    mongoc_collection_t *c = wh__gen_coll(m, gen, false);
    bson_t *filter = BCON_NEW("_id", BCON_UTF8("ctr"));
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, c, filter, &doc, &found, "read position counter", err);
    *n = found ? wh__get_u64_or0(&doc, "n") : 0;
    if (t) *t = found ? wh__get_u64_or0(&doc, "t") : 0;
    bson_destroy(&doc);
    bson_destroy(filter);
    mongoc_collection_destroy(c);
    return ok;
}

bool wh__gen_last_put(wh__mongo_t *m, uint64_t gen, uint64_t *t, wh_err_t *err) {
    uint64_t n = 0;
    return wh__counter_t(m, gen, &n, t, err);
}

/* Full when every position has its manifest. The counter is read first so
 * that the common not-full case costs one lookup by _id. */
bool wh__gen_full(wh__mongo_t *m, uint64_t gen, bool *full, uint64_t *fill, wh_err_t *err) {
    uint64_t ctr = 0, n = 0;
    *full = false;
    if (!wh__counter_t(m, gen, &ctr, NULL, err)) return false;
    if (ctr < m->base.cfg.swap_cap && !fill) return true;
    if (!wh__count_manifests(m, gen, &n, err)) return false;
    *full = n >= m->base.cfg.swap_cap;
    if (fill) *fill = n;
    return true;
}
