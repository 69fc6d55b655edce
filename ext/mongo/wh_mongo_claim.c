/* MongoDB backend: spec mode's claims (docs/reproducible.md). The claim of
 * position pos of generation g is a document of <p>.gen.<g>.c:
 *
 *   {_id: pos, k: index, a: attempts so far, tok: the holding claim's token
 *    (0: free, another attempt may take it), pid, host, node: the holder's,
 *    l: its lease in ms, rt: its last renewal and t0: its claim (both the
 *    server's $currentDate), done: its sample is committed, failed: it
 *    failed for good, why: the last attempt's failure}
 *
 * Every change is one conditional write on the document (its tok and a as
 * read, and for an expired lease the expiry itself, {$expr: rt + l <
 * $$NOW}, evaluated by the server): of claimers racing for a position
 * exactly one matches. A position is handed out the first time by the
 * {_id: "next"} counter ($inc while below SWAP_CAP); its claim document is
 * then created by an upsert that can only insert. A claimer killed between
 * the two leaves a position without a claim: once the counter is spent,
 * claimers look for such holes and take them.
 *
 * A claim is free to take when its holder freed it (fn raised), when its
 * lease ran out on the server's clock, or when its holder ran on this node
 * (same boot and pid namespace) and its pid is gone. */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <signal.h>

#include "wh_mongo_int.h"

#define WH__CLAIM_ROUNDS 8 /* opens, seals and lost races in one claim call */
#define WH__CANDIDATES 16

typedef enum {
    WH__FREE,
    WH__FAILED,
    WH__EXPIRED,
    WH__DEAD
} wh__why_t;

typedef struct {
    uint32_t pos;
    int64_t tok, a, pid, l;
    char host[64];
    wh__why_t why;
    char msg[WH_ERR_LEN]; /* FAILED: the recorded failure */
} wh__cand_t;

typedef enum {
    WH__GOT,
    WH__NONE,
    WH__SPECFAIL
} wh__took_t;

/* This process's node: the boot id and pid namespace, so a claim's pid is
 * looked up only where it means the same process. "" when unknown. */
static const char *wh__node(wh__mongo_t *m) {
    if (m->node_known) return m->node;
    m->node_known = true;
    m->node[0] = '\0';
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    struct stat sb;
    if (boot[0] && stat("/proc/self/ns/pid", &sb) == 0)
        snprintf(m->node, sizeof m->node, "%s/%llu", boot, (unsigned long long)sb.st_ino);
    return m->node;
}

static void wh__str(const bson_t *d, const char *key, char *out, size_t cap) {
    bson_iter_t it;
    out[0] = '\0';
    if (bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_UTF8(&it))
        snprintf(out, cap, "%s", bson_iter_utf8(&it, NULL));
}

/* {$lt: [{$add: ["$rt", "$l"]}, "$$NOW"]}: the lease ran out, by the server's clock */
static void wh__append_expired(bson_t *q) {
    BCON_APPEND(q, "$expr", "{", "$lt", "[", "{", "$add", "[", BCON_UTF8("$rt"), BCON_UTF8("$l"),
                "]", "}", BCON_UTF8("$$NOW"), "]", "}");
}

/* What a new holder writes: it, its lease, and the server's time. */
static void wh__append_holder(bson_t *u, wh__mongo_t *m, int64_t tok, int64_t lease_ms,
                              bool first) {
    bson_t set, cd;
    BSON_APPEND_DOCUMENT_BEGIN(u, "$set", &set);
    BSON_APPEND_INT64(&set, "tok", tok);
    BSON_APPEND_INT64(&set, "pid", (int64_t)m->pid);
    BSON_APPEND_UTF8(&set, "host", m->host);
    BSON_APPEND_UTF8(&set, "node", wh__node(m));
    BSON_APPEND_INT64(&set, "l", lease_ms);
    if (first) {
        BSON_APPEND_INT64(&set, "a", 1);
        BSON_APPEND_BOOL(&set, "done", false);
        BSON_APPEND_BOOL(&set, "failed", false);
    }
    bson_append_document_end(u, &set);
    BSON_APPEND_DOCUMENT_BEGIN(u, "$currentDate", &cd);
    BSON_APPEND_BOOL(&cd, "rt", true);
    BSON_APPEND_BOOL(&cd, "t0", true);
    bson_append_document_end(u, &cd);
}

/* {_id: pos, tok, a, done: false, failed: false}: the claim as it was read */
static bson_t *wh__as_read(const wh__cand_t *c) {
    return BCON_NEW("_id", BCON_INT32((int32_t)c->pos), "tok", BCON_INT64(c->tok), "a",
                    BCON_INT64(c->a), "done", BCON_BOOL(false), "failed", BCON_BOOL(false));
}

static bool wh__claims_update(wh__mongo_t *m, mongoc_collection_t *cc, const bson_t *sel,
                              const bson_t *upd, const bson_t *opts, bool *matched, bool *dup,
                              const char *what, wh_err_t *err) {
    bson_t reply;
    bson_error_t e;
    bool ok = mongoc_collection_update_one(cc, sel, upd, opts, &reply, &e);
    int64_t n = 0;
    *matched = false;
    if (dup) *dup = !ok && wh__is_dup(&e);
    if (ok) {
        bson_iter_t it;
        wh__get_int(&reply, "matchedCount", &n);
        *matched = n > 0 || bson_iter_init_find(&it, &reply, "upsertedId");
    } else if (!(dup && *dup)) {
        wh__merr(m, err, &e, "%s", what);
    }
    bson_destroy(&reply);
    return ok || (dup && *dup);
}

/* Creates the claim of a position never claimed: an upsert whose filter
 * no existing claim matches, so it inserts or collides (*won false). */
static bool wh__claim_new(wh__mongo_t *m, mongoc_collection_t *cc, uint32_t pos, uint64_t k,
                          int64_t tok, int64_t lease_ms, bool *won, wh_err_t *err) {
    bson_t *sel = BCON_NEW("_id", BCON_INT32((int32_t)pos), "a", "{", "$lt", BCON_INT64(0), "}");
    bson_t upd = BSON_INITIALIZER;
    wh__append_holder(&upd, m, tok, lease_ms, true);
    bson_t set2; /* $set above is closed: k goes with $setOnInsert */
    BSON_APPEND_DOCUMENT_BEGIN(&upd, "$setOnInsert", &set2);
    BSON_APPEND_INT64(&set2, "k", (int64_t)k);
    bson_append_document_end(&upd, &set2);
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
    bool dup = false;
    bool ok = wh__claims_update(m, cc, sel, &upd, opts, won, &dup, "claim a sample index", err);
    if (dup) *won = false;
    bson_destroy(sel);
    bson_destroy(&upd);
    bson_destroy(opts);
    return ok;
}

/* The claims worth retaking, lowest position first: free, failed, expired
 * (the server's clock), and this node's whose pid is gone. */
static bool wh__candidates(wh__mongo_t *m, mongoc_collection_t *cc, wh__cand_t *out, int *n,
                           wh_err_t *err) {
    const int64_t cap = m->base.cfg.swap_cap;
    *n = 0;
    for (int pass = 0; pass < 2 && *n < WH__CANDIDATES; pass++) {
        const char *node = wh__node(m);
        if (pass == 1 && !node[0]) break;
        bson_t *q = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt", BCON_INT64(cap), "}", "done",
                             BCON_BOOL(false));
        if (pass == 0) {
            bson_t or, a, b, c;
            BSON_APPEND_ARRAY_BEGIN(q, "$or", & or);
            BSON_APPEND_DOCUMENT_BEGIN(& or, "0", &a);
            BSON_APPEND_INT64(&a, "tok", 0);
            bson_append_document_end(& or, &a);
            BSON_APPEND_DOCUMENT_BEGIN(& or, "1", &b);
            BSON_APPEND_BOOL(&b, "failed", true);
            bson_append_document_end(& or, &b);
            BSON_APPEND_DOCUMENT_BEGIN(& or, "2", &c);
            wh__append_expired(&c);
            bson_append_document_end(& or, &c);
            bson_append_array_end(q, & or);
        } else {
            BCON_APPEND(q, "failed", BCON_BOOL(false), "node", BCON_UTF8(node), "tok", "{", "$ne",
                        BCON_INT64(0), "}");
        }
        bson_t *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(1), "}", "limit",
                                BCON_INT64(pass ? 256 : WH__CANDIDATES), "batchSize",
                                BCON_INT32(pass ? 256 : WH__CANDIDATES));
        mongoc_cursor_t *cur = mongoc_collection_find_with_opts(cc, q, opts, NULL);
        const bson_t *d;
        while (mongoc_cursor_next(cur, &d) && *n < WH__CANDIDATES) {
            wh__cand_t c = {0};
            int64_t pos = -1;
            bson_iter_t it;
            bool failed = bson_iter_init_find(&it, d, "failed") && BSON_ITER_HOLDS_BOOL(&it) &&
                          bson_iter_bool(&it);
            if (!wh__get_int(d, "_id", &pos) || pos < 0 || pos >= cap ||
                !wh__get_int(d, "tok", &c.tok) || !wh__get_int(d, "a", &c.a) || c.a < 1)
                continue; /* not a claim this build wrote */
            wh__get_int(d, "pid", &c.pid);
            if (!wh__get_int(d, "l", &c.l) || c.l < 1) c.l = 0;
            wh__str(d, "host", c.host, sizeof c.host);
            c.pos = (uint32_t)pos;
            if (pass == 1) { /* this node's: only a pid that is gone */
                if (c.pid <= 0 || c.pid == m->pid || kill((pid_t)c.pid, 0) == 0 || errno != ESRCH)
                    continue;
                c.why = WH__DEAD;
            } else {
                c.why = failed ? WH__FAILED : c.tok == 0 ? WH__FREE : WH__EXPIRED;
                wh__str(d, "why", c.msg, sizeof c.msg);
            }
            out[(*n)++] = c;
        }
        bson_error_t e;
        bool ok = !mongoc_cursor_error(cur, &e) || wh__merr(m, err, &e, "list claims");
        mongoc_cursor_destroy(cur);
        bson_destroy(q);
        bson_destroy(opts);
        if (!ok) return false;
    }
    return true;
}

/* Whether position pos of g has its sample committed. */
static bool wh__committed(wh__mongo_t *m, uint64_t g, uint32_t pos, bool *yes, wh_err_t *err) {
    mongoc_collection_t *mc = wh__gen_coll(m, g, true);
    bson_t *q = BCON_NEW("_id", BCON_INT32((int32_t)pos));
    bson_t doc = BSON_INITIALIZER;
    bool ok = wh__find_one(m, mc, q, &doc, yes, "read a manifest", err);
    bson_destroy(&doc);
    bson_destroy(q);
    mongoc_collection_destroy(mc);
    return ok;
}

static void wh__fill_out(wh_claim_t *out, const wh__state_t *s, uint32_t cap, uint32_t pos,
                         int64_t a, int64_t tok) {
    out->spec_gen = s->spec.open_s;
    out->pos = pos;
    out->index = s->spec.open_s * cap + pos;
    out->gen = s->spec.open_g;
    out->params_version = s->spec.open_pv;
    out->attempt = (uint32_t)a;
    out->token = (uint64_t)tok;
}

/* The failure message of the contract: "sample index K (generation S,
 * position P) failed A attempts; last by pid X on host H<tail>". */
static void wh__fail_msg(char *out, size_t cap, uint64_t k, uint64_t s, uint32_t pos, int64_t a,
                         int64_t pid, const char *host, const char *tail) {
    snprintf(out, cap,
             "sample index %llu (generation %llu, position %u) failed %lld attempts; "
             "last by pid %lld on host %s%s",
             (unsigned long long)k, (unsigned long long)s, pos, (long long)a, (long long)pid,
             host[0] ? host : "?", tail);
}

/* Takes over one candidate: *took GOT (out filled), SPECFAIL (the index
 * failed for good: recorded), or NONE (lost a race, or nothing to take).
 * Every write acts on the claim as it was read and, taken for expired,
 * still expired. */
static bool wh__retake(wh__mongo_t *m, mongoc_collection_t *cc, const wh__state_t *s,
                       const wh__cand_t *c, int64_t lease_ms, uint32_t max_attempts,
                       wh_claim_t *out, wh__took_t *took, wh_err_t *err) {
    const uint32_t cap = m->base.cfg.swap_cap;
    const uint64_t k = s->spec.open_s * cap + c->pos;
    *took = WH__NONE;
    if (c->why == WH__FAILED) {
        if (!wh__spec_record_fail(m, s->spec.open_s, k, c->msg, err)) return false;
        *took = WH__SPECFAIL;
        return true;
    }
    bson_t *sel = wh__as_read(c);
    if (c->why == WH__EXPIRED) wh__append_expired(sel);
    bool ok = true, committed = false, matched = false;
    if (c->why != WH__FREE) ok = wh__committed(m, s->spec.open_g, c->pos, &committed, err);
    if (ok && committed) { /* by a put that died before saying so */
        bson_t *upd = BCON_NEW("$set", "{", "done", BCON_BOOL(true), "}");
        ok = wh__claims_update(m, cc, sel, upd, NULL, &matched, NULL, "mark a claim done", err);
        bson_destroy(upd);
    } else if (ok && c->a >= (int64_t)max_attempts) {
        /* its last attempt died, went silent, or (freed by a claimer that
         * allowed more attempts) raised: the index fails for good */
        char msg[WH_ERR_LEN], tail[64];
        if (c->why == WH__DEAD)
            snprintf(tail, sizeof tail, ", which died holding it");
        else
            snprintf(tail, sizeof tail, ", whose claim expired after %gs", (double)c->l / 1000.0);
        if (c->why == WH__FREE && c->msg[0])
            snprintf(msg, sizeof msg, "%s", c->msg);
        else
            wh__fail_msg(msg, sizeof msg, k, s->spec.open_s, c->pos, c->a, c->pid, c->host, tail);
        bson_t *upd = BCON_NEW("$set", "{", "failed", BCON_BOOL(true), "tok", BCON_INT64(0), "why",
                               BCON_UTF8(msg), "}");
        ok = wh__claims_update(m, cc, sel, upd, NULL, &matched, NULL, "fail a sample index", err);
        bson_destroy(upd);
        if (ok && matched) {
            ok = wh__spec_record_fail(m, s->spec.open_s, k, msg, err);
            *took = WH__SPECFAIL;
        }
    } else if (ok) {
        int64_t tok = (int64_t)(wh__rand64() >> 1) | 1;
        bson_t upd = BSON_INITIALIZER, inc;
        wh__append_holder(&upd, m, tok, lease_ms, false);
        BSON_APPEND_DOCUMENT_BEGIN(&upd, "$inc", &inc);
        BSON_APPEND_INT64(&inc, "a", 1);
        bson_append_document_end(&upd, &inc);
        ok = wh__claims_update(m, cc, sel, &upd, NULL, &matched, NULL, "take over a claim", err);
        bson_destroy(&upd);
        if (ok && matched) {
            wh__fill_out(out, s, cap, c->pos, c->a + 1, tok);
            *took = WH__GOT;
        }
    }
    bson_destroy(sel);
    return ok;
}

/* Positions handed out whose claim was never written (a claimer killed in
 * between): takes the first it can into *pos (*got). */
static bool wh__take_hole(wh__mongo_t *m, mongoc_collection_t *cc, const wh__state_t *s,
                          int64_t tok, int64_t lease_ms, uint32_t *pos, bool *got, wh_err_t *err) {
    const uint32_t cap = m->base.cfg.swap_cap;
    *got = false;
    bson_t *q = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt", BCON_INT64(cap), "}");
    bson_error_t e;
    int64_t have = mongoc_collection_count_documents(cc, q, NULL, NULL, NULL, &e);
    bool ok = have >= 0 || wh__merr(m, err, &e, "count claims");
    unsigned char *seen = NULL;
    if (ok && have < cap) {
        seen = calloc(cap, 1);
        if (!seen) ok = wh_err_set(err, WH_E_SYS, "out of memory");
    }
    if (ok && seen) {
        ok = wh__positions(m, cc, seen, "list claims", err);
        for (uint32_t p = 0; ok && !*got && p < cap; p++)
            if (!seen[p]) {
                ok = wh__claim_new(m, cc, p, s->spec.open_s * cap + p, tok, lease_ms, got, err);
                *pos = p;
            }
    }
    free(seen);
    bson_destroy(q);
    return ok;
}

/* A claim in the open generation: *took GOT, SPECFAIL, or NONE when every
 * position is claimed by a live claimer or committed. */
static bool wh__claim_open(wh__mongo_t *m, const wh__state_t *s, int64_t lease_ms,
                           uint32_t max_attempts, wh_claim_t *out, wh__took_t *took,
                           wh_err_t *err) {
    const uint32_t cap = m->base.cfg.swap_cap;
    mongoc_collection_t *cc = wh__claims_coll(m, s->spec.open_g);
    wh__cand_t *cand = calloc(WH__CANDIDATES, sizeof *cand);
    int n = 0;
    bool ok = cand != NULL || wh_err_set(err, WH_E_SYS, "out of memory");
    *took = WH__NONE;
    /* a freed, expired or dead claimer's index first */
    if (ok) ok = wh__candidates(m, cc, cand, &n, err);
    for (int i = 0; ok && i < n && *took == WH__NONE; i++)
        ok = wh__retake(m, cc, s, &cand[i], lease_ms, max_attempts, out, took, err);
    /* else the next never claimed, then a hole */
    const int64_t tok = (int64_t)(wh__rand64() >> 1) | 1;
    for (int tries = 0; ok && *took == WH__NONE && tries < 4; tries++) {
        uint32_t pos = 0;
        int64_t next = 0;
        bool spent = false, won = false;
        ok = wh__spec_counter(m, cc, "next", cap, &next, &spent, err);
        if (ok && spent) {
            ok = wh__take_hole(m, cc, s, tok, lease_ms, &pos, &won, err);
        } else if (ok) {
            pos = (uint32_t)(next - 1);
            ok = wh__claim_new(m, cc, pos, s->spec.open_s * cap + pos, tok, lease_ms, &won, err);
        }
        if (ok && won) {
            wh__fill_out(out, s, cap, pos, 1, tok);
            *took = WH__GOT;
        }
        if (spent) break;
    }
    free(cand);
    mongoc_collection_destroy(cc);
    return ok;
}

bool wh__mongo_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                          wh_claim_status_t *status, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    int64_t lease_ms = (int64_t)(lease_s * 1000.0 + 0.5);
    if (lease_ms < 1) lease_ms = 1;
    *status = WH_CLAIM_WAIT;
    for (int round = 0; round < WH__CLAIM_ROUNDS; round++) {
        wh__state_t s;
        wh__needs_t nd;
        if (!wh__state_get(m, true, &s, NULL, err) || !wh__spec_needs(m, &nd, err))
            return wh_err_prefix(err, "spec claim");
        if (!s.spec.on)
            return wh_err_set(err, WH_E_INVALID, "spec claim: store %s is not in spec mode",
                              m->where);
        const uint64_t floor = wh__spec_floor(m, &s, &nd);
        if (s.spec.open) {
            if (s.spec.open_s < floor || s.spec.open_s >= floor + WH_SPEC_AHEAD) {
                /* readers moved where it is not needed: made again if ever needed */
                if (!wh__spec_abandon(m, &s, err)) return wh_err_prefix(err, "spec claim");
                continue;
            }
            if (wh__spec_failed(&s.spec, s.spec.open_s))
                return wh__spec_fail_err(m, s.spec.open_s, err);
            wh__took_t took;
            if (!wh__claim_open(m, &s, lease_ms, (uint32_t)max_attempts, out, &took, err))
                return wh_err_prefix(err, "spec claim in generation %llu",
                                     (unsigned long long)s.spec.open_s);
            if (took == WH__GOT) {
                *status = WH_CLAIM_OK;
                return true;
            }
            if (took == WH__SPECFAIL) return wh__spec_fail_err(m, s.spec.open_s, err);
            /* nothing to take: complete, its last put having died before
             * sealing, or every index is with a live claimer */
            bool sealed = false;
            if (!wh__spec_settle(m, &s, &sealed, NULL, err))
                return wh_err_prefix(err, "spec claim");
            bool exists = false;
            wh__state_t now;
            if (!wh__state_get(m, false, &now, &exists, err)) return false;
            if (exists && now.spec.open && now.spec.open_g == s.spec.open_g) return true; /* WAIT */
            continue;
        }
        /* none open: the lowest spec generation of the window not kept */
        uint64_t sg = floor;
        while (sg < floor + WH_SPEC_AHEAD && wh__spec_kept(&s.spec, sg, NULL)) sg++;
        if (sg >= floor + WH_SPEC_AHEAD) {
            *status = WH_CLAIM_AHEAD;
            return true;
        }
        if (wh__spec_failed(&s.spec, sg)) return wh__spec_fail_err(m, sg, err);
        /* room first: what the window and the readers no longer need */
        if (!wh__spec_reclaim(m, &s, &nd, floor, err) || !wh__spec_open(m, &s, sg, err))
            return wh_err_prefix(err, "spec claim: open spec generation %llu",
                                 (unsigned long long)sg);
    }
    return true; /* WAIT: raced with other claimers every round; try again */
}

bool wh__mongo_spec_renew(wh_store_t *st, const wh_claim_t *c, double lease_s, bool *mine,
                          wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    int64_t lease_ms = (int64_t)(lease_s * 1000.0 + 0.5);
    if (lease_ms < 1) lease_ms = 1;
    mongoc_collection_t *cc = wh__claims_coll(m, c->gen);
    bson_t *sel = BCON_NEW("_id", BCON_INT32((int32_t)c->pos), "tok", BCON_INT64((int64_t)c->token),
                           "done", BCON_BOOL(false), "failed", BCON_BOOL(false));
    bson_t *upd = BCON_NEW("$set", "{", "l", BCON_INT64(lease_ms), "}", "$currentDate", "{", "rt",
                           BCON_BOOL(true), "}");
    bool ok = wh__claims_update(m, cc, sel, upd, NULL, mine, NULL, "renew a claim", err);
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(cc);
    return ok || wh_err_prefix(err, "sample index %llu", (unsigned long long)c->index);
}

bool wh__mongo_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts,
                         const char *why, bool *failed, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    char msg[WH_ERR_LEN], tail[300]; /* why, cut to fit the message */
    snprintf(tail, sizeof tail, ": %.280s", why);
    wh__fail_msg(msg, sizeof msg, c->index, c->spec_gen, c->pos, c->attempt, m->pid, m->host, tail);
    *failed = c->attempt >= max_attempts;
    mongoc_collection_t *cc = wh__claims_coll(m, c->gen);
    bson_t *sel =
        BCON_NEW("_id", BCON_INT32((int32_t)c->pos), "tok", BCON_INT64((int64_t)c->token), "a",
                 BCON_INT64(c->attempt), "done", BCON_BOOL(false), "failed", BCON_BOOL(false));
    /* freed for another attempt (tok 0), or failed for good */
    bson_t *upd = BCON_NEW("$set", "{", "tok", BCON_INT64(0), "why", BCON_UTF8(msg), "failed",
                           BCON_BOOL(*failed), "}");
    bool matched = false;
    bool ok =
        wh__claims_update(m, cc, sel, upd, NULL, &matched, NULL, "record a failed attempt", err);
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(cc);
    if (ok && !matched) *failed = false; /* no longer this claim's: nothing recorded */
    if (ok && *failed) ok = wh__spec_record_fail(m, c->spec_gen, c->index, msg, err);
    return ok || wh_err_prefix(err, "sample index %llu", (unsigned long long)c->index);
}
