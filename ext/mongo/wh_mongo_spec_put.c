/* MongoDB backend: spec mode's put (docs/reproducible.md). Sample k goes
 * to its position as a put does (chunks under a fresh sample id, then the
 * manifest with _id = position, which the unique _id lets exactly one
 * sample win); a put that loses deletes its chunks and compares its
 * checksums with the winner's header. The winner marks the claim done,
 * counts the commit, and the put whose count reaches SWAP_CAP seals once
 * every manifest is there. Killed after its commit, it leaves a full
 * generation that the next claim (or a manager's seal) seals. */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* The same sample: every field's dtype, shape and checksum. */
static bool wh__same(const wh_sample_meta_t *a, const wh_sample_meta_t *b) {
    if (a->nfields != b->nfields) return false;
    for (int i = 0; i < a->nfields; i++) {
        const wh_field_meta_t *x = &a->f[i], *y = &b->f[i];
        if (x->dtype != y->dtype || x->ndim != y->ndim || x->nbytes != y->nbytes ||
            x->checksum != y->checksum)
            return false;
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d]) return false;
    }
    return true;
}

/* The committed sample's header at pos of g against ours: SAME or
 * DIFFERENT (*found false when none is committed). */
static bool wh__compare(wh__mongo_t *m, uint64_t g, uint32_t pos, const wh_sample_meta_t *ours,
                        bool *found, wh_spec_put_t *status, wh_err_t *err) {
    mongoc_collection_t *mc = wh__gen_coll(m, g, true);
    bson_t *q = BCON_NEW("_id", BCON_INT32((int32_t)pos));
    bson_t man = BSON_INITIALIZER;
    bool ok = wh__find_one(m, mc, q, &man, found, "read the committed manifest", err);
    if (ok && *found) {
        const uint8_t *h = NULL;
        uint32_t hlen = 0;
        bson_iter_t it;
        if (bson_iter_init_find(&it, &man, "h") && BSON_ITER_HOLDS_BINARY(&it))
            bson_iter_binary(&it, NULL, &hlen, &h);
        wh_sample_meta_t theirs;
        if (!h)
            ok = wh_err_set(err, WH_E_CORRUPT, "its manifest has no header");
        else
            ok = wh_sample_decode_meta(h, hlen, &m->base.cfg.schema, g, pos, &theirs, err);
        if (ok)
            *status = wh__same(ours, &theirs) ? WH_SPEC_PUT_SAME : WH_SPEC_PUT_DIFFERENT;
        else
            wh_err_prefix(err, "the sample committed at generation %llu position %u",
                          (unsigned long long)g, pos);
    }
    bson_destroy(&man);
    bson_destroy(q);
    mongoc_collection_destroy(mc);
    return ok;
}

/* A dropped duplicate counted in the state document (and as
 * nondeterministic when its bytes differ), its claim done (the
 * position is committed); and, the generation still open, sealed if its
 * last put died before sealing. */
static bool wh__duplicate(wh__mongo_t *m, const wh__state_t *s, const wh_claim_t *c,
                          wh_spec_put_t status, bool *sealed, wh_err_t *err) {
    mongoc_collection_t *sc = wh__state_coll(m);
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"));
    bson_t *upd = BCON_NEW("$inc", "{", "spec.dup", BCON_INT64(1), "spec.nondet",
                           BCON_INT64(status == WH_SPEC_PUT_DIFFERENT), "}");
    bson_error_t e;
    bool ok = mongoc_collection_update_one(sc, sel, upd, NULL, NULL, &e) ||
              wh__merr(m, err, &e, "count a duplicate put");
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(sc);
    if (ok && s->spec.open && s->spec.open_g == c->gen)
        ok =
            wh__spec_claim_done(m, c->gen, c->pos, err) && wh__spec_settle(m, s, sealed, NULL, err);
    return ok;
}

bool wh__mongo_spec_put(wh_store_t *st, const wh_claim_t *c, const wh_array_t *arr, int n,
                        wh_spec_put_t *status, bool *sealed, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    const uint32_t cap = st->cfg.swap_cap;
    const uint64_t g = c->gen;
    if (!g || c->index / cap != c->spec_gen || c->index % cap != c->pos)
        return wh_err_set(err, WH_E_INVALID,
                          "spec put: claim of index %llu names generation %llu position %u, "
                          "which SWAP_CAP=%u does not give",
                          (unsigned long long)c->index, (unsigned long long)c->spec_gen, c->pos,
                          cap);
    wh_sample_meta_t meta;
    uint64_t nchunks = 0;
    if (!wh__encode(m, arr, n, c->params_version, &meta, &nchunks, err)) return false;
    wh_sample_set_place(m->buf, &meta, g, c->pos);
    const uint64_t hlen = meta.header_size, len = meta.total_size - meta.header_size;
    const uint64_t cb = m->chunk_bytes;

    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "spec put");
    if (!wh__spec_holds(&s.spec, g)) { /* abandoned or reclaimed: nothing written */
        *status = WH_SPEC_PUT_GONE;
        return true;
    }
    /* committed already (sealed, or another put won): the bytes need not travel */
    bool found = false;
    if (!wh__compare(m, g, c->pos, &meta, &found, status, err)) return false;
    if (found) return wh__duplicate(m, &s, c, *status, sealed, err);
    if (!(s.spec.open && s.spec.open_g == g)) { /* sealed, yet no sample there */
        bool exists = false;
        if (!wh__state_get(m, false, &s, &exists, err)) return false;
        if (!exists || !wh__spec_holds(&s.spec, g)) { /* reclaimed meanwhile */
            *status = WH_SPEC_PUT_GONE;
            return true;
        }
        return wh_err_set(err, WH_E_CORRUPT,
                          "spec generation %llu (generation %llu) is sealed without position %u",
                          (unsigned long long)c->spec_gen, (unsigned long long)g, c->pos);
    }

    mongoc_collection_t *cc = wh__gen_coll(m, g, false), *mc = wh__gen_coll(m, g, true);
    bool won = false;
    int64_t sid = 0;
    bool ok = wh__write_chunks(m, cc, &meta, nchunks, &sid, err); /* none left on failure */
    const bool wrote = ok;
    if (ok) ok = wh__insert_manifest(m, mc, c->pos, sid, nchunks, len, cb, m->buf, hlen, &won, err);
    if (!ok || !won) { /* another put won the position (or the commit failed) */
        if (wrote) wh__delete_chunks(m, cc, sid, nchunks, NULL);
        if (ok) ok = wh__compare(m, g, c->pos, &meta, &found, status, err);
        if (ok && !found)
            ok = wh_err_set(err, WH_E_INTERNAL, "position %u was taken and is empty", c->pos);
        if (ok) ok = wh__duplicate(m, &s, c, *status, sealed, err);
        goto out;
    }
    wh_fault_spec_committed();
    /* abandoned meanwhile: the collections our writes made again are swept */
    bool exists = false;
    ok = wh__state_get(m, false, &s, &exists, err);
    if (ok && !(exists && wh__spec_holds(&s.spec, g))) {
        wh__delete_chunks(m, cc, sid, nchunks, NULL);
        *status = WH_SPEC_PUT_GONE;
        goto out;
    }
    /* counted, then the put that counts the last position seals, and only
     * then is the claim done: a claimer finding every claim done and the
     * generation unsealed knows its sealer died (wh__spec_settle) */
    int64_t fill = 0;
    bool spent = false;
    if (ok) {
        mongoc_collection_t *claims = wh__claims_coll(m, g);
        ok = wh__spec_counter(m, claims, "fill", 0, &fill, &spent, err);
        mongoc_collection_destroy(claims);
        if (ok && spent)
            ok = wh_err_set(err, WH_E_CORRUPT, "generation %llu has no commit counter",
                            (unsigned long long)g);
    }
    if (ok && fill >= cap) ok = wh__spec_complete(m, &s, sealed, NULL, err);
    if (ok) ok = wh__spec_claim_done(m, g, c->pos, err);
    if (ok) *status = WH_SPEC_PUT_ACCEPTED;
out:
    mongoc_collection_destroy(cc);
    mongoc_collection_destroy(mc);
    if (!ok)
        return wh_err_prefix(err, "spec put of sample index %llu into generation %llu",
                             (unsigned long long)c->index, (unsigned long long)g);
    return true;
}
