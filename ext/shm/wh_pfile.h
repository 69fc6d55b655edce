/* The shm backend's params side file (wh_pfile.c, docs/params.md): the
 * params operations wh_shm.c puts in its table, and removal by clean.
 * Private to shm/. */
#ifndef WH_PFILE_H
#define WH_PFILE_H

#include "wh_store_types.h"

typedef struct wh_pfile wh_pfile_t;

/* A handle on the params file at path (not opened until first used);
 * NULL when out of memory. The caller's: wh_pfile_destroy. */
wh_pfile_t *wh_pfile_new(const char *path);
void wh_pfile_destroy(wh_pfile_t *p);
/* As wh_store_params_set, _get and _version (wh_store.h); a set waits at
 * most wait_s for another setter's lock. */
bool wh_pfile_set(wh_pfile_t *p, double wait_s, const char *doc, size_t len, uint64_t *version,
                  wh_err_t *err);
bool wh_pfile_get(wh_pfile_t *p, uint64_t *version, char **doc, size_t *len, wh_err_t *err);
bool wh_pfile_version(wh_pfile_t *p, uint64_t *version, wh_err_t *err);
/* Removes the file at path (none there: true). */
bool wh_pfile_clean(const char *path, wh_err_t *err);

#endif
