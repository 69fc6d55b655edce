/* The scheme table: the one place a URI's scheme names its backend, and the
 * calls that need a backend before (or without) a handle: open's lookup,
 * clean, collections, what a scheme's stores can do, and a view's mapping. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wh_mongo.h"
#include "wh_shm.h"
#include "wh_store_int.h"

/* One line per scheme (a backend may have several); a new backend adds its
 * line and its header above. */
static const struct {
    const char *prefix; /* the scheme and "://" */
    const wh_store_ops_t *ops;
} wh__schemes[] = {
    {"shm://", &wh_shm_ops},
    {"mongodb://", &wh_mongo_ops},
    {"mongodb+srv://", &wh_mongo_ops},
};

#define WH__NSCHEMES ((int)WH_ARRAY_LEN(wh__schemes))

/* The table's index of uri's scheme, or -1. */
static int wh__find(const char *uri) {
    for (int i = 0; uri && i < WH__NSCHEMES; i++)
        if (!strncmp(uri, wh__schemes[i].prefix, strlen(wh__schemes[i].prefix))) return i;
    return -1;
}

/* "a, b or c" of the schemes whose backends have every bit of cap. */
static void wh__list(char *out, size_t cap_len, unsigned cap) {
    int n = 0, k = 0;
    for (int i = 0; i < WH__NSCHEMES; i++) n += (wh_backend_caps(wh__schemes[i].ops) & cap) == cap;
    out[0] = 0;
    for (int i = 0; i < WH__NSCHEMES; i++) {
        if ((wh_backend_caps(wh__schemes[i].ops) & cap) != cap) continue;
        size_t used = strlen(out);
        snprintf(out + used, cap_len - used, "%s%s",
                 k == 0       ? ""
                 : k == n - 1 ? " or "
                              : ", ",
                 wh__schemes[i].prefix);
        k++;
    }
}

const wh_store_ops_t *wh_scheme_ops(const char *uri, wh_err_t *err) {
    int i = wh__find(uri);
    if (i >= 0) return wh__schemes[i].ops;
    char all[256];
    wh__list(all, sizeof all, 0);
    return wh_err_set(err, WH_E_INVALID, "store URI must start with %s (STORE key)", all), NULL;
}

bool wh_store_backend_of(const char *uri, wh_backend_info_t *out, wh_err_t *err) {
    const wh_store_ops_t *ops = wh_scheme_ops(uri, err);
    if (!ops) return false;
    const char *prefix = wh__schemes[wh__find(uri)].prefix;
    size_t n = strlen(prefix) - strlen("://");
    memset(out, 0, sizeof *out);
    snprintf(out->scheme, sizeof out->scheme, "%.*s", (int)n, prefix);
    out->backend = ops->name;
    out->caps = wh_backend_caps(ops);
    out->name = ops->check_name ? uri + strlen(prefix) : NULL;
    return true;
}

unsigned wh_store_caps(const wh_store_t *st) { return wh_backend_caps(st->ops); }

bool wh_store_lacks(const wh_store_t *st, unsigned cap, const char *what, wh_err_t *err) {
    char have[256] = "";
    if (cap) wh__list(have, sizeof have, cap);
    if (!have[0])
        return wh_err_set(err, WH_E_INVALID, "%s: the %s backend has none", what, st->ops->name);
    return wh_err_set(err, WH_E_INVALID, "%s need a store of %s; the %s backend has none", what,
                      have, st->ops->name);
}

bool wh_store_clean(const wh_store_config_t *cfg, wh_err_t *err) {
    const wh_store_ops_t *ops = wh_scheme_ops(cfg->uri, err);
    return ops && ops->clean(cfg, err);
}

bool wh_store_collections(const wh_store_config_t *cfg, char ***names, wh_err_t *err) {
    const wh_store_ops_t *ops = wh_scheme_ops(cfg->uri, err);
    if (!ops) return false;
    if (!ops->collections)
        return wh_err_set(err, WH_E_INVALID, "collections: the %s backend keeps none", ops->name);
    return ops->collections(cfg, names, err);
}

void wh_store_names_free(char **names) {
    for (char **p = names; p && *p; p++) free(*p);
    free(names);
}

/* ---- a view's mapping: asked of each backend that has mappings ---- */

void *wh_store_view_map(const wh_buf_t *view, const void **base, size_t *len) {
    for (int i = 0; view && i < WH__NSCHEMES; i++) {
        const wh_store_ops_t *ops = wh__schemes[i].ops;
        void *m = wh_backend_caps(ops) & WH_CAP_MAPPABLE ? ops->view_map(view, base, len) : NULL;
        if (m) return m;
    }
    return NULL;
}

bool wh_store_view_intact(const wh_buf_t *view, wh_err_t *err) {
    for (int i = 0; view && i < WH__NSCHEMES; i++) {
        const wh_store_ops_t *ops = wh__schemes[i].ops;
        if (ops->view_intact && !ops->view_intact(view, err)) return false;
    }
    return true;
}

void wh_store_map_unref(void *map) {
    if (map) ((wh_store_map_head_t *)map)->ops->map_unref(map);
}

bool wh_store_map_in_use(void *map) { return ((wh_store_map_head_t *)map)->ops->map_in_use(map); }
