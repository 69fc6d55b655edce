/* The MongoDB backend's extras beside its operation table: the bounds of
 * a chunk document (Python reads them as _C.CHUNK_BYTES_MAX and
 * _C.CHUNK_BYTES_DEFAULT). Everything else the store reaches through
 * wh_mongo_ops: reads, encoded reads (a relay's source), the collections
 * of the store's database. */
#ifndef WH_MONGO_H
#define WH_MONGO_H

#include "wh_backend.h"

/* A chunk document's payload: MongoDB's 16 MiB document limit, less room
 * for its keys; the default (CHUNKSIZE 4 MiB). */
#define WH_MONGO_CHUNK_MAX (16u * 1024 * 1024 - 16 * 1024)
#define WH_MONGO_CHUNK_DEFAULT (4u * 1024 * 1024)

/* How often a handle re-reads the params version when no put told it. */
#define WH_PARAMS_POLL_S 1.0

/* The mongodb:// and mongodb+srv:// lines of the scheme table (wh_scheme.c). */
extern const wh_store_ops_t wh_mongo_ops;

#endif
