/* Private to store/'s files: the store API (wh_store.h) over the handle's
 * head and the backends' operation table (wh_backend.h), and the scheme
 * table's lookups the dispatch uses (wh_scheme.c). */
#ifndef WH_STORE_INT_H
#define WH_STORE_INT_H

#include "wh_backend.h"
#include "wh_store.h"

/* The backend of uri's scheme, or NULL with WH_E_INVALID naming every
 * scheme the table knows. */
const wh_store_ops_t *wh_scheme_ops(const char *uri, wh_err_t *err);

/* False with WH_E_INVALID for a call st's backend lacks the op of: what (a
 * noun phrase, "store-backed views") needs a backend with cap (the schemes
 * whose backends have it are named; 0: none named), and st's has none.
 * Every optional op's dispatch: `if (!st->ops->x) return wh_store_lacks(...)`. */
bool wh_store_lacks(const wh_store_t *st, unsigned cap, const char *what, wh_err_t *err);

#endif
