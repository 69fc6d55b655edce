/* The node-local tier: a relay copies each sealed generation of a store
 * whose backend can be its source (WH_CAP_RELAY_SOURCE: MongoDB) once into
 * a node's local store (WH_CAP_RELAY_TARGET: shm), same generation number,
 * positions and encoded bytes, and seals it there, so every rank on the
 * node reads local memory (docs/relay.md). */
#ifndef WH_RELAY_H
#define WH_RELAY_H

#include "wh_store.h"

typedef struct {
    uint64_t gen;     /* the generation mirrored */
    uint32_t samples; /* positions copied */
    uint64_t bytes;   /* encoded sample bytes pulled from the source */
    uint64_t ns;      /* the pull and the seal */
} wh_relay_info_t;

/* Copies sealed generation gen of src into dst (WH_E_INVALID naming the
 * backend of either that cannot be that), each sample's bytes going from
 * the server's reply straight into dst's area with every checksum checked,
 * then seals it in dst. budget: bytes per
 * area should dst not exist yet (0: SWAP_CAP x the first sample, a quarter
 * more, and a MiB). WH_E_GONE when src reclaims gen meanwhile (dst keeps
 * its read generation; pull the newest next); WH_E_LEASE when another relay
 * fills dst; WH_E_PINNED when readers keep every free area of dst pinned
 * for more than wait_s. */
bool wh_relay_pull(wh_store_t *src, wh_store_t *dst, uint64_t gen, uint64_t budget, double wait_s,
                   wh_relay_info_t *info, wh_err_t *err);

#endif
