/* Embedded backend: open, clean, destroy, the params operations over the
 * side file, and the operation table over every room of shm/ (the top one:
 * wh_shm_int.h lists them). */
#define _GNU_SOURCE
#include "wh_shm_int.h"

static wh_store_t *wh__shm_open(const wh_store_config_t *cfg, wh_err_t *err) {
    if (cfg->byte_budget && cfg->byte_budget < WH_BYTE_BUDGET_MIN)
        return wh_err_set(err, WH_E_INVALID, "BYTE_BUDGET must be at least %u bytes",
                          WH_BYTE_BUDGET_MIN),
               NULL;
    wh__shm_t *s = calloc(1, sizeof *s);
    if (!s) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    s->base.ops = &wh_shm_ops;
    if (!wh__shm_init(s, cfg, err)) goto fail;
    s->pfile = wh_pfile_new(s->files.params);
    if (!s->pfile) {
        wh_err_set(err, WH_E_SYS, "out of memory");
        goto fail;
    }
    wh_err_t e = {0};
    if (wh__shm_ready(s, NULL, 0, &e)) return &s->base;
    /* BYTE_BUDGET auto and no segment yet: every operation but a put sees
     * an empty store until a generator's first put creates it */
    if (e.code == WH_E_NOSTORE && !cfg->byte_budget && !cfg->no_create) return &s->base;
    if (e.code == WH_E_NOSTORE && cfg->no_create)
        wh_err_set(&e, WH_E_NOTFOUND, "no shm store '%s' (%s)", s->name, s->files.segment);
    if (err) *err = e;
fail:
    wh_pfile_destroy(s->pfile);
    free(s);
    return NULL;
}

/* The segment and the params file; the relay's files are its own. */
static bool wh__shm_clean(const wh_store_config_t *cfg, wh_err_t *err) {
    wh_shm_files_t f;
    if (!wh_shm_files(wh__shm_uri_name(cfg->uri), &f, err)) return false;
    return wh__shm_remove(cfg, &f, err) && wh_pfile_clean(f.params, err);
}

static void wh__shm_destroy(wh_store_t *st) {
    wh__shm_t *s = (wh__shm_t *)st;
    wh_guard_ensure(); /* at exit too: leaving the readers' table writes the segment */
    if (getpid() == s->pid) wh__shm_beat_drop(s);
    wh_pfile_destroy(s->pfile);
    wh__shm_map_unref(s->map); /* unmapped once the last view is gone too */
    if (s->fd >= 0) close(s->fd);
    free(s);
}

static bool wh__params_set(wh_store_t *st, const char *doc, size_t len, uint64_t *version,
                           wh_err_t *err) {
    return wh_pfile_set(((wh__shm_t *)st)->pfile, st->cfg.lease_s, doc, len, version, err);
}

static bool wh__params_get(wh_store_t *st, uint64_t *version, char **doc, size_t *len,
                           wh_err_t *err) {
    return wh_pfile_get(((wh__shm_t *)st)->pfile, version, doc, len, err);
}

static bool wh__params_version(wh_store_t *st, uint64_t *version, wh_err_t *err) {
    return wh_pfile_version(((wh__shm_t *)st)->pfile, version, err);
}

/* A spec store's seal only completes what its last put left (its
 * generations seal themselves, docs/reproducible.md). */
static bool wh__seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__shm_t *s = (wh__shm_t *)st;
    if (!wh__shm_ready(s, NULL, 0, err)) return false;
    if (s->spec_off) return wh__shm_spec_seal_full(st, sealed, info, err);
    return wh__shm_seal(st, sealed, info, err);
}

const wh_store_ops_t wh_shm_ops = {
    .name = "shm",
    .flags = WH_CAP_PARAMS_FILE,
    .open = wh__shm_open,
    .clean = wh__shm_clean,
    .put = wh__shm_put,
    .lead = wh__shm_lead,
    .resign = wh__shm_resign,
    .seal = wh__seal,
    .current = wh__shm_current,
    .read = wh__shm_read,
    .status = wh__shm_status,
    .params_set = wh__params_set,
    .params_get = wh__params_get,
    .params_version = wh__params_version,
    .destroy = wh__shm_destroy,
    .check_name = wh_shm_check_name,
    .view = wh__shm_view,
    .set_dma_views = wh__shm_set_dma_views,
    .read_held = wh__shm_read_held,
    .view_map = wh__shm_view_map,
    .map_unref = wh__shm_map_release,
    .map_in_use = wh__shm_map_in_use,
    .view_intact = wh__shm_view_intact,
    .beat = wh__shm_beat,
    .beat_every_s = WH_READER_BEAT_S,
    .mirror_begin = wh__shm_mirror_begin,
    .mirror_reserve = wh__shm_mirror_reserve,
    .mirror_commit = wh__shm_mirror_commit,
    .spec_claim = wh__shm_spec_claim,
    .spec_renew = wh__shm_spec_renew,
    .spec_fail = wh__shm_spec_fail,
    .spec_put = wh__shm_spec_put,
    .spec_locate = wh__shm_spec_locate,
    .spec_need = wh__shm_spec_need,
    .spec_params = wh__shm_spec_params,
    .spec_status = wh__shm_spec_status,
};
