/* Spec mode over the backends (docs/reproducible.md): the calls of
 * wh_store.h's spec section, each checked for the fork guard and for the
 * backend's spec capability before it reaches the backend. */
#define _GNU_SOURCE
#include <string.h>

#include "wh_store_int.h"

/* The store must be in spec mode and its backend must have spec ops. */
static bool wh__spec_ok(wh_store_t *st, bool need_op, wh_err_t *err) {
    if (!wh_store_here(st, err)) return false;
    if (!need_op) return wh_store_lacks(st, WH_CAP_SPEC, "spec mode (RUN_SEED)", err);
    if (!st->cfg.spec)
        return wh_err_set(err, WH_E_INVALID,
                          "store %s is not opened in spec mode: the config has no RUN_SEED",
                          st->uri);
    return true;
}

bool wh_store_spec_claim(wh_store_t *st, double lease_s, uint32_t max_attempts, wh_claim_t *out,
                         wh_claim_status_t *status, wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_claim, err)) return false;
    if (!(lease_s > 0) || max_attempts < 1)
        return wh_err_set(err, WH_E_INVALID,
                          "spec claim: CLAIM_LEASE must be > 0 and SPEC_ATTEMPTS >= 1 (got %g, %u)",
                          lease_s, max_attempts);
    memset(out, 0, sizeof *out);
    return st->ops->spec_claim(st, lease_s, max_attempts, out, status, err);
}

bool wh_store_spec_renew(wh_store_t *st, const wh_claim_t *c, double lease_s, bool *mine,
                         wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_renew, err)) return false;
    return st->ops->spec_renew(st, c, lease_s, mine, err);
}

bool wh_store_spec_fail(wh_store_t *st, const wh_claim_t *c, uint32_t max_attempts, const char *why,
                        bool *failed, wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_fail, err)) return false;
    return st->ops->spec_fail(st, c, max_attempts, why ? why : "", failed, err);
}

bool wh_store_spec_put(wh_store_t *st, const wh_claim_t *c, const wh_array_t *arr, int n,
                       wh_spec_put_t *status, bool *sealed, wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_put, err)) return false;
    if (!wh_store_pos_check(st, c->pos, err)) return false;
    *sealed = false;
    bool ok = st->ops->spec_put(st, c, arr, n, status, sealed, err);
    if (ok && err) err->code = WH_OK;
    return ok;
}

bool wh_store_spec_locate(wh_store_t *st, uint64_t s, uint64_t *gen, wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_locate, err)) return false;
    *gen = 0;
    return st->ops->spec_locate(st, s, gen, err);
}

bool wh_store_spec_need(wh_store_t *st, uint64_t s, wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_need, err)) return false;
    return st->ops->spec_need(st, s, err);
}

bool wh_store_spec_params(wh_store_t *st, const wh_claim_t *c, char **doc, size_t *len,
                          wh_err_t *err) {
    if (!wh__spec_ok(st, st->ops->spec_params, err)) return false;
    *doc = NULL;
    *len = 0;
    return st->ops->spec_params(st, c, doc, len, err);
}

bool wh_store_spec_status(wh_store_t *st, wh_spec_status_t *out, wh_err_t *err) {
    memset(out, 0, sizeof *out);
    if (!wh_store_here(st, err)) return false;
    if (!st->ops->spec_status) return true; /* a backend without spec mode: spec false */
    return st->ops->spec_status(st, out, err);
}
