/* MongoDB backend: spec mode's part of the state document, without I/O
 * (fuzzed with the state parser). A store made with RUN_SEED holds
 *
 *   spec: {run_seed: <RUN_SEED's 64 bits as int64>,
 *          floor: <need_min last computed>,
 *          open: {s, g, pv, t} while spec generation s is filled in
 *                generation g under params version pv (absent: none),
 *          kept: [{s, g}, ...] the sealed spec generations stored
 *                (at most WH__SPEC_KEPT),
 *          dup: puts dropped (another put of the index won first),
 *          nondet: those of them with other bytes,
 *          fails: [{s, k, m}, ...] indices that failed for good, and why
 *                (at most WH__SPEC_FAILS)}
 *
 * and a store made without it has no spec field: every opener's config
 * must agree (docs/reproducible.md). */
#include "wh_mongo_int.h"

void wh__spec_append(bson_t *init, const wh_store_config_t *cfg) {
    if (!cfg->spec) return;
    bson_t sp, arr;
    BSON_APPEND_DOCUMENT_BEGIN(init, "spec", &sp);
    BSON_APPEND_INT64(&sp, "run_seed", (int64_t)cfg->run_seed);
    BSON_APPEND_INT64(&sp, "floor", 0);
    BSON_APPEND_ARRAY_BEGIN(&sp, "kept", &arr);
    bson_append_array_end(&sp, &arr);
    BSON_APPEND_ARRAY_BEGIN(&sp, "fails", &arr);
    bson_append_array_end(&sp, &arr);
    BSON_APPEND_INT64(&sp, "dup", 0);
    BSON_APPEND_INT64(&sp, "nondet", 0);
    bson_append_document_end(init, &sp);
}

/* The store's RUN_SEED: *on false for a store made without one. */
static bool wh__spec_seed(const wh__mongo_t *m, const bson_t *doc, bool *on, uint64_t *seed,
                          wh_err_t *err) {
    bson_iter_t it;
    *on = bson_iter_init_find(&it, doc, "spec");
    if (!*on) return true;
    int64_t v = 0;
    if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !wh__get_int(doc, "spec.run_seed", &v))
        return wh_err_set(err, WH_E_CORRUPT,
                          "store %s (collection prefix '%s'): the state document's spec "
                          "section lacks its run_seed",
                          m->where, m->prefix);
    *seed = (uint64_t)v;
    return true;
}

bool wh__spec_check(const wh__mongo_t *m, const bson_t *doc, wh_err_t *err) {
    const wh_store_config_t *cfg = &m->base.cfg;
    bool on = false;
    uint64_t seed = 0;
    if (!wh__spec_seed(m, doc, &on, &seed, err)) return false;
    const char *tail = "(two runs never share a store: clean it or name another STORE)";
    if (on && cfg->spec && seed != cfg->run_seed)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store %s (collection prefix '%s') was created with RUN_SEED=%llu; "
                          "this config has RUN_SEED=%llu %s",
                          m->where, m->prefix, (unsigned long long)seed,
                          (unsigned long long)cfg->run_seed, tail);
    if (!on && cfg->spec)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store %s (collection prefix '%s') was created without RUN_SEED "
                          "(freshest mode); this config sets RUN_SEED=%llu %s",
                          m->where, m->prefix, (unsigned long long)cfg->run_seed, tail);
    if (on && !cfg->spec)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store %s (collection prefix '%s') was created with RUN_SEED=%llu "
                          "(spec mode); this config has no RUN_SEED %s",
                          m->where, m->prefix, (unsigned long long)seed, tail);
    return true;
}

/* A non-negative integer at key of d into *out (false: missing or bad). */
static bool wh__u63(const bson_t *d, const char *key, uint64_t *out) {
    int64_t v = 0;
    if (!wh__get_int(d, key, &v) || v < 0) return false;
    *out = (uint64_t)v;
    return true;
}

/* The array at key of doc, each document element given to fn (false from
 * fn: a damaged element). */
static bool wh__each(const bson_t *doc, const char *key, bool (*fn)(const bson_t *, void *),
                     void *ctx) {
    bson_iter_t it, arr;
    if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, key, &it)) return true;
    if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &arr)) return false;
    while (bson_iter_next(&arr)) {
        if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) return false;
        uint32_t len;
        const uint8_t *data;
        bson_iter_document(&arr, &len, &data);
        bson_t e;
        if (!bson_init_static(&e, data, len) || !fn(&e, ctx)) return false;
    }
    return true;
}

static bool wh__kept_one(const bson_t *e, void *ctx) {
    wh__spec_t *sp = ctx;
    uint64_t s, g;
    if (!wh__u63(e, "s", &s) || !wh__u63(e, "g", &g) || !g) return false;
    if (sp->nkept < WH__SPEC_KEPT) { /* the seal's $slice keeps it so; more: ignored */
        sp->kept[sp->nkept].s = s;
        sp->kept[sp->nkept++].g = g;
    }
    return true;
}

static bool wh__fail_one(const bson_t *e, void *ctx) {
    wh__spec_t *sp = ctx;
    uint64_t s, k;
    if (!wh__u63(e, "s", &s) || !wh__u63(e, "k", &k)) return false;
    if (sp->nfails < WH__SPEC_FAILS) {
        sp->fails[sp->nfails].s = s;
        sp->fails[sp->nfails++].k = k;
    }
    return true;
}

bool wh__spec_parse(const wh__mongo_t *m, const bson_t *doc, wh__spec_t *sp, wh_err_t *err) {
    memset(sp, 0, sizeof *sp);
    if (!wh__spec_seed(m, doc, &sp->on, &sp->run_seed, err)) return false;
    if (!sp->on) return true;
    const char *bad = NULL;
    bson_iter_t it;
    sp->floor = wh__get_u64_or0(doc, "spec.floor");
    sp->dup = wh__get_u64_or0(doc, "spec.dup");
    sp->nondet = wh__get_u64_or0(doc, "spec.nondet");
    if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "spec.open", &it)) {
        sp->open = wh__u63(doc, "spec.open.s", &sp->open_s) &&
                   wh__u63(doc, "spec.open.g", &sp->open_g) &&
                   wh__u63(doc, "spec.open.pv", &sp->open_pv) && sp->open_g;
        if (!sp->open) bad = "open";
    }
    if (!bad && !wh__each(doc, "spec.kept", wh__kept_one, sp)) bad = "kept";
    if (!bad && !wh__each(doc, "spec.fails", wh__fail_one, sp)) bad = "fails";
    if (bad)
        return wh_err_set(err, WH_E_CORRUPT,
                          "store %s (collection prefix '%s'): the state document's spec.%s is "
                          "damaged",
                          m->where, m->prefix, bad);
    return true;
}

bool wh__spec_kept(const wh__spec_t *sp, uint64_t s, uint64_t *g) {
    for (int i = 0; i < sp->nkept; i++)
        if (sp->kept[i].s == s) {
            if (g) *g = sp->kept[i].g;
            return true;
        }
    return false;
}

bool wh__spec_holds(const wh__spec_t *sp, uint64_t g) {
    if (!sp->on) return false;
    if (sp->open && sp->open_g == g) return true;
    for (int i = 0; i < sp->nkept; i++)
        if (sp->kept[i].g == g) return true;
    return false;
}

bool wh__spec_failed(const wh__spec_t *sp, uint64_t s) {
    for (int i = 0; i < sp->nfails; i++)
        if (sp->fails[i].s == s) return true;
    return false;
}
