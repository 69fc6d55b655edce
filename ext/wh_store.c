/* Store dispatch: picks the backend from the URI scheme. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "wh_store.h"

static bool wh__is(const char *uri, const char *scheme) {
    return strncmp(uri, scheme, strlen(scheme)) == 0;
}

wh_store_t *wh_store_open(const wh_store_config_t *cfg, wh_err_t *err) {
    wh_store_t *st = NULL;
    if (!cfg->uri) return wh_err_set(err, WH_E_INVALID, "no store URI"), NULL;
    if (wh__is(cfg->uri, "shm://"))
        st = wh_shm_open(cfg, err);
    else if (wh__is(cfg->uri, "mongodb://") || wh__is(cfg->uri, "mongodb+srv://"))
        st = wh_mongo_open(cfg, err);
    else
        return wh_err_set(err, WH_E_INVALID,
                          "store URI must start with shm:// or mongodb:// (STORE key)"),
               NULL;
    if (!st) return NULL;
    /* the caller's strings need not outlive the call */
    st->uri = strdup(cfg->uri);
    st->cfg.uri = st->uri;
    st->cfg.dbname = NULL;
    st->cfg.prefix = NULL;
    if (!st->uri) {
        st->ops->destroy(st);
        return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    }
    return st;
}

void wh_store_destroy(wh_store_t *st) {
    if (!st) return;
    free(st->uri);
    st->ops->destroy(st);
}

bool wh_store_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                  wh_put_status_t *status, uint64_t *gen, wh_err_t *err) {
    return st->ops->put(st, arr, n, wait_ms, status, gen, err);
}

bool wh_store_lead(wh_store_t *st, bool *leader, wh_err_t *err) {
    return st->ops->lead(st, leader, err);
}

bool wh_store_resign(wh_store_t *st, wh_err_t *err) { return st->ops->resign(st, err); }

bool wh_store_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    return st->ops->seal(st, sealed, info, err);
}

bool wh_store_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    return st->ops->current(st, gen, err);
}

bool wh_store_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                   wh_sample_meta_t *meta, wh_err_t *err) {
    return st->ops->read(st, gen, pos, fn, ctx, meta, err);
}

bool wh_store_status(wh_store_t *st, wh_status_t *out, wh_err_t *err) {
    return st->ops->status(st, out, err);
}

bool wh_store_clean(const wh_store_config_t *cfg, wh_err_t *err) {
    if (cfg->uri && wh__is(cfg->uri, "shm://")) return wh_shm_clean(cfg->uri + 6, err);
    if (cfg->uri && (wh__is(cfg->uri, "mongodb://") || wh__is(cfg->uri, "mongodb+srv://")))
        return wh_mongo_clean(cfg, err);
    return wh_err_set(err, WH_E_INVALID, "store URI must start with shm:// or mongodb://");
}
