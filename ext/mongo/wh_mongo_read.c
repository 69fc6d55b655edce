/* MongoDB backend: reads (manifest and chunk documents checked by pure
 * functions, chunk bytes copied straight into the caller's buffers). */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* Samples at least this large have their chunks counted before a reader
 * allocates for them. */
#define WH__CONFIRM_BYTES (64ull << 20)

/* ---- reader ---- */

bool wh__mongo_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return false;
    *gen = s.read_gen;
    return true;
}

/* Data of gen is missing: gone (reclaimed) or corrupt (gen still live). */
static bool wh__missing(wh__mongo_t *m, uint64_t gen, uint32_t pos, const char *what,
                        wh_err_t *err) {
    wh__state_t s;
    bool exists = false;
    if (!wh__state_get(m, false, &s, &exists, err)) return false;
    if (!exists || (gen != s.read_gen && gen != s.retiring && !wh__spec_holds(&s.spec, gen)))
        return wh_store_err_gone(err, gen);
    return wh_err_set(err, WH_E_CORRUPT, "generation %llu position %u: %s", (unsigned long long)gen,
                      pos, what);
}

static bool wh__corrupt(uint64_t gen, uint32_t pos, wh_err_t *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool wh__corrupt(uint64_t gen, uint32_t pos, wh_err_t *err, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return wh_err_set(err, WH_E_CORRUPT, "generation %llu position %u: %s", (unsigned long long)gen,
                      pos, what);
}

/* Fields checked as their chunks are copied in (docs/guarantees.md, "Ring
 * batches"): done[i] bytes of field i hashed so far, in order; a field
 * whose chunks come out of order is hashed after the copy instead. */
typedef struct {
    wh_field_hash_t **h; /* per field, NULL: not checked while copying */
    uint64_t done[WH_MAX_FIELDS];
    bool in_order[WH_MAX_FIELDS];
} wh__checks_t;

/* Copies one chunk's bytes (sample offsets [start, start+len)) into the
 * field buffers it overlaps, hashing them on the way where c says so. */
static void wh__scatter(const wh_sample_meta_t *meta, void *const *dst, uint64_t start,
                        const uint8_t *src, uint64_t len, wh__checks_t *c) {
    uint64_t end = start + len;
    for (int i = 0; i < meta->nfields; i++) {
        const wh_field_meta_t *f = &meta->f[i];
        if (!dst[i] || !f->nbytes) continue;
        uint64_t a = f->offset > start ? f->offset : start;
        uint64_t b = f->offset + f->nbytes < end ? f->offset + f->nbytes : end;
        if (a >= b) continue;
        char *to = (char *)dst[i] + (a - f->offset);
        if (c && c->in_order[i] && c->done[i] == a - f->offset) {
            wh_field_hash_copy(c->h[i], to, src + (a - start), b - a);
            c->done[i] += b - a;
        } else {
            if (c) c->in_order[i] = false;
            memcpy(to, src + (a - start), b - a);
        }
    }
}

/* In raw mode, the chunk's bytes outside every field (alignment padding). */
static void wh__gaps(const wh_sample_meta_t *meta, char *base, uint64_t start, const uint8_t *src,
                     uint64_t len) {
    uint64_t from = start, end = start + len;
    for (int i = 0; i <= meta->nfields && from < end; i++) {
        uint64_t to = i < meta->nfields ? meta->f[i].offset : end;
        if (to > end) to = end;
        if (to > from) memcpy(base + from, src + (from - start), to - from);
        if (i < meta->nfields && meta->f[i].offset + meta->f[i].nbytes > from)
            from = meta->f[i].offset + meta->f[i].nbytes;
    }
}

typedef struct {
    int64_t sid;                /* the sample's chunk id */
    uint64_t cb, nchunks, dlen; /* chunk size, chunk count, data bytes */
} wh__manifest_t;

/* A manifest document checked against the schema, the place it was read
 * from and the store's limits, without I/O (fuzzed on its own); meta gets
 * the sample's layout. */
static bool wh__parse_manifest(const bson_t *man, const wh_schema_t *schema, uint64_t gen,
                               uint32_t pos, wh__manifest_t *out, wh_sample_meta_t *meta,
                               wh_err_t *err) {
    int64_t sid = 0, k = 0, z = 0, b = 0;
    const uint8_t *hdr = NULL;
    uint32_t hlen = 0;
    bson_iter_t it;
    if (bson_iter_init_find(&it, man, "h") && BSON_ITER_HOLDS_BINARY(&it))
        bson_iter_binary(&it, NULL, &hlen, &hdr);
    if (!wh__get_int(man, "s", &sid) || !wh__get_int(man, "k", &k) || !wh__get_int(man, "z", &z) ||
        !wh__get_int(man, "b", &b) || !hdr)
        return wh__corrupt(gen, pos, err, "manifest lacks s, k, z, b or h");
    if (!wh_sample_decode_meta(hdr, hlen, schema, gen, pos, meta, err))
        return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    uint64_t dlen = meta->total_size - meta->header_size;
    if (hlen != meta->header_size)
        return wh__corrupt(gen, pos, err, "manifest header is %u bytes, its layout says %llu", hlen,
                           (unsigned long long)meta->header_size);
    if (z < 0 || (uint64_t)z != dlen)
        return wh__corrupt(gen, pos, err, "manifest says %lld data bytes, header says %llu",
                           (long long)z, (unsigned long long)dlen);
    if (b < 1 || b > (int64_t)WH__MAX_CHUNK)
        return wh__corrupt(gen, pos, err, "manifest chunk size %lld out of range", (long long)b);
    uint64_t cb = (uint64_t)b, nchunks = (dlen + cb - 1) / cb;
    if (k < 0 || (uint64_t)k != nchunks)
        return wh__corrupt(gen, pos, err, "manifest says %lld chunks, sizes need %llu",
                           (long long)k, (unsigned long long)nchunks);
    if (nchunks > WH__MAX_CHUNKS)
        return wh__corrupt(gen, pos, err, "manifest claims %llu chunks, at most %u are written",
                           (unsigned long long)nchunks, WH__MAX_CHUNKS);
    *out = (wh__manifest_t){sid, cb, nchunks, dlen};
    return true;
}

/* A chunk document of the sample mf describes, checked without I/O (fuzzed
 * on its own): its id, that it was not seen before (seen: nchunks flags),
 * and its length. */
static bool wh__parse_chunk(const bson_t *doc, const wh__manifest_t *mf, const unsigned char *seen,
                            uint64_t gen, uint32_t pos, int64_t *dc, const uint8_t **bytes,
                            uint32_t *blen, wh_err_t *err) {
    int64_t ds = 0;
    *dc = -1;
    *bytes = NULL;
    *blen = 0;
    if (!wh__get_int(doc, "_id.s", &ds) || !wh__get_int(doc, "_id.c", dc) || ds != mf->sid)
        return wh__corrupt(gen, pos, err, "chunk document with a malformed _id");
    if (*dc < 0 || (uint64_t)*dc >= mf->nchunks || seen[*dc])
        return wh__corrupt(gen, pos, err, "unexpected chunk %lld (sample has %llu)", (long long)*dc,
                           (unsigned long long)mf->nchunks);
    bson_iter_t it;
    if (bson_iter_init_find(&it, doc, "d") && BSON_ITER_HOLDS_BINARY(&it))
        bson_iter_binary(&it, NULL, blen, bytes);
    uint64_t off = (uint64_t)*dc * mf->cb;
    uint64_t want = mf->dlen - off < mf->cb ? mf->dlen - off : mf->cb;
    if (!*bytes || *blen != want)
        return wh__corrupt(gen, pos, err, "chunk %lld holds %u bytes, manifest expects %llu",
                           (long long)*dc, *bytes ? *blen : 0, (unsigned long long)want);
    return true;
}

/* raw: the encoded sample whole (header from the manifest, then every
 * chunk byte, padding included) into the one buffer raw gives, checked
 * field by field; fn is not used then. */
static bool wh__read_impl(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                          wh_raw_fn raw, wh_sample_meta_t *meta_out, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    const wh_schema_t *schema = &st->cfg.schema;
    if (!wh_store_pos_check(st, pos, err)) return false;
    if (gen == 0 || gen > m->known_read) {
        wh__state_t s;
        if (!wh__state_get(m, true, &s, NULL, err)) return false;
        if (gen == 0 || (gen > s.read_gen && gen >= s.write_gen))
            return wh_err_set(err, WH_E_NOTFOUND, "generation %llu is not sealed (newest is %llu)",
                              (unsigned long long)gen, (unsigned long long)s.read_gen);
        if (gen > s.read_gen) /* older epoch of a wiped database */
            return wh_store_err_gone(err, gen);
    }

    /* manifest */
    mongoc_collection_t *mc = wh__gen_coll(m, gen, true);
    bson_t *filter = BCON_NEW("_id", BCON_INT32((int32_t)pos));
    bson_t man = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, mc, filter, &man, &found, "read manifest", err);
    bson_destroy(filter);
    mongoc_collection_destroy(mc);
    if (!ok) {
        bson_destroy(&man);
        return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    }
    if (!found) {
        bson_destroy(&man);
        return wh__missing(m, gen, pos, "manifest missing", err);
    }
    wh__manifest_t mf = {0};
    wh_sample_meta_t meta;
    ok = wh__parse_manifest(&man, schema, gen, pos, &mf, &meta, err);
    char *base = NULL;
    if (ok && raw) {
        /* the header bytes as stored (checked by the parse above) */
        bson_iter_t hi;
        const uint8_t *hdr = NULL;
        uint32_t hlen = 0;
        if (bson_iter_init_find(&hi, &man, "h") && BSON_ITER_HOLDS_BINARY(&hi))
            bson_iter_binary(&hi, NULL, &hlen, &hdr);
        ok = raw(ctx, &meta, (void **)&base, err);
        if (ok && (!hdr || hlen != meta.header_size))
            ok = wh__corrupt(gen, pos, err, "manifest header changed");
        if (ok) memcpy(base, hdr, hlen);
    }
    bson_destroy(&man);
    if (!ok) return false;
    const int64_t sid = mf.sid;
    const uint64_t cb = mf.cb, nchunks = mf.nchunks, dlen = mf.dlen;

    /* a large claim is confirmed before memory is allocated for it: the
     * chunks must exist, so a forged manifest costs a count, not its size */
    if (fn && dlen >= WH__CONFIRM_BYTES) {
        bson_t q = BSON_INITIALIZER;
        wh__chunk_filter(&q, sid, nchunks);
        mongoc_collection_t *c = wh__gen_coll(m, gen, false);
        bson_error_t e;
        int64_t have = mongoc_collection_count_documents(c, &q, NULL, NULL, NULL, &e);
        mongoc_collection_destroy(c);
        bson_destroy(&q);
        if (have < 0)
            return wh__merr(m, err, &e, "read generation %llu position %u", (unsigned long long)gen,
                            pos);
        if ((uint64_t)have != nchunks) {
            char what[160];
            snprintf(what, sizeof what, "manifest claims %llu bytes in %llu chunks, %lld exist",
                     (unsigned long long)dlen, (unsigned long long)nchunks, (long long)have);
            return wh__missing(m, gen, pos, what, err);
        }
    }
    void *dst[WH_MAX_FIELDS] = {0};
    if (raw)
        for (int i = 0; i < meta.nfields; i++) dst[i] = base + meta.f[i].offset;
    else if (fn && !fn(ctx, &meta, dst, err))
        return false;
    bool any = raw != NULL;
    for (int i = 0; i < meta.nfields; i++) any |= dst[i] != NULL && meta.f[i].nbytes > 0;

    const bool verify = raw || st->cfg.verify_reads;
    wh__checks_t checks = {.h = m->hashes};
    for (int i = 0; verify && i < meta.nfields; i++) {
        if (!dst[i] || !meta.f[i].nbytes) continue;
        if (!m->hashes[i] && !(m->hashes[i] = wh_field_hash_new()))
            return wh_err_set(err, WH_E_SYS, "out of memory");
        wh_field_hash_reset(m->hashes[i]);
        checks.in_order[i] = true;
    }
    if (any && nchunks) {
        if (!wh__grow(&m->seen, &m->seen_cap, nchunks, err)) return false;
        memset(m->seen, 0, nchunks);
        bson_t q = BSON_INITIALIZER;
        wh__chunk_filter(&q, sid, nchunks);
        uint64_t per = WH__BATCH_BYTES / (cb + 256);
        if (per < 1) per = 1;
        if (per > nchunks) per = nchunks;
        bson_t *opts = BCON_NEW("batchSize", BCON_INT32((int32_t)per));
        mongoc_collection_t *c = wh__gen_coll(m, gen, false);
        mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &q, opts, NULL);
        const bson_t *doc;
        uint64_t got = 0;
        bool bad = false;
        while (!bad && mongoc_cursor_next(cur, &doc)) {
            int64_t dc = -1;
            const uint8_t *bytes = NULL;
            uint32_t blen = 0;
            if (!wh__parse_chunk(doc, &mf, m->seen, gen, pos, &dc, &bytes, &blen, err)) {
                bad = true;
                break;
            }
            uint64_t off = (uint64_t)dc * cb;
            m->seen[dc] = 1;
            got++;
            wh__scatter(&meta, dst, meta.header_size + off, bytes, blen, verify ? &checks : NULL);
            if (raw) wh__gaps(&meta, base, meta.header_size + off, bytes, blen);
        }
        bson_error_t e;
        bool cerr = !bad && mongoc_cursor_error(cur, &e);
        mongoc_cursor_destroy(cur);
        mongoc_collection_destroy(c);
        bson_destroy(opts);
        bson_destroy(&q);
        if (bad) return false;
        if (cerr) {
            if (wh__is_unavail(&e))
                return wh__merr(m, err, &e, "read generation %llu position %u",
                                (unsigned long long)gen, pos);
            /* a cursor killed by a drop reads as gone */
            wh_err_t tmp;
            if (!wh__missing(m, gen, pos, "chunk cursor failed", &tmp) && tmp.code == WH_E_GONE) {
                *err = tmp;
                return false;
            }
            return wh__merr(m, err, &e, "read generation %llu position %u", (unsigned long long)gen,
                            pos);
        }
        if (got != nchunks) {
            char what[128];
            snprintf(what, sizeof what, "%llu of %llu chunks missing",
                     (unsigned long long)(nchunks - got), (unsigned long long)nchunks);
            return wh__missing(m, gen, pos, what, err);
        }
    }
    for (int i = 0; i < meta.nfields; i++) {
        if (!dst[i]) continue;
        bool intact = true;
        if (verify && checks.in_order[i] && checks.done[i] == meta.f[i].nbytes)
            intact = wh_field_hash_check(m->hashes[i], schema, &meta, i, err);
        else if (verify) /* chunks out of order: a second pass */
            intact = wh_sample_verify(schema, &meta, i, dst[i], err);
        if (!intact)
            return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
        wh_count_out(meta.f[i].nbytes);
    }
    if (meta_out) *meta_out = meta;
    return true;
}

bool wh__mongo_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                    wh_sample_meta_t *meta_out, wh_err_t *err) {
    return wh__read_impl(st, gen, pos, fn, ctx, NULL, meta_out, err);
}

bool wh__mongo_read_encoded(wh_store_t *st, uint64_t gen, uint32_t pos, wh_raw_fn fn, void *ctx,
                            wh_sample_meta_t *meta, wh_err_t *err) {
    return wh__read_impl(st, gen, pos, NULL, ctx, fn, meta, err);
}
