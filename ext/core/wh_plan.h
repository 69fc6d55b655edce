/* wirehead_torch: sample order for DDP ranks and DataLoader workers.
 *
 * Pure arithmetic (docs/design.md, "Sample order for DDP and DataLoader
 * workers"): every process computes the same order from the same few
 * numbers, so no coordination is needed. No allocation, no globals; every
 * function is thread-safe.
 *
 *   W = world * max(workers, 1), global worker g = rank * max(workers, 1) + worker.
 *   Worker g at its step k reads position pi[g + k*W], where pi = pi(seed, epoch)
 *   is a permutation of 0..swap_cap-1 that never depends on W.
 *   Steps past the end (g + k*W >= swap_cap) are padding: a real position,
 *   repeated, with is_pad = true.
 */
#ifndef WH_PLAN_H
#define WH_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "wh.h"

typedef enum {
    WH_PAD_REPEAT = 0,
    WH_PAD_IGNORE = 1,
    WH_PAD_DROP = 2
} wh_pad_t;

typedef struct {
    uint32_t swap_cap; /* N >= 1: positions per generation */
    uint32_t world;    /* >= 1 */
    uint32_t rank;     /* < world */
    uint32_t workers;  /* DataLoader num_workers; 0 means in-process (treated as 1) */
    uint32_t worker;   /* < max(workers, 1) */
    uint32_t batch;    /* 0 = no batch padding; else each worker pads to whole batches */
    bool shuffle;
    bool drop_last; /* with batch > 0: whole batches only, the partial last one dropped */
    uint64_t seed;
    int pad; /* wh_pad_t */
} wh_plan_t;

/* Validates every field; on a bad one fills err (WH_E_INVALID) with a message
 * naming the field and its value, and returns false. err may be NULL. */
bool wh_plan_check(const wh_plan_t *p, wh_err_t *err);

/* Items each worker yields per epoch; the same for every rank and worker.
 * c = ceil(N/W) (repeat, ignore) or floor(N/W) (drop); with batch > 0,
 * rounded down to whole batches when drop_last, else (pad != drop) rounded
 * up to whole batches. 0 is possible (drop with N < W, drop_last with
 * c < batch): callers say so. p must pass wh_plan_check. */
uint64_t wh_plan_steps(const wh_plan_t *p);

/* The item at this worker's step k of the epoch: its position in
 * 0..swap_cap-1 and whether it is padding. A k >= steps also gives a valid
 * position, marked as padding. p must pass wh_plan_check. */
void wh_plan_item(const wh_plan_t *p, uint64_t epoch, uint64_t k, uint32_t *pos, bool *is_pad);

/* Batches one rank's DataLoader yields per epoch: the sum over the rank's
 * max(workers, 1) workers of ceil(steps / batch). 0 when batch == 0 (then
 * len() is wh_plan_rank_items). */
uint64_t wh_plan_rank_batches(const wh_plan_t *p);

/* Items one rank yields per epoch: steps * max(workers, 1). */
uint64_t wh_plan_rank_items(const wh_plan_t *p);

/* Padding items one rank yields per epoch (is_pad from the plan; corrupt
 * samples skipped at read time come on top): over all ranks max(0, W*steps - N). */
uint64_t wh_plan_rank_pads(const wh_plan_t *p);

/* Resume after the rank has consumed `consumed` batches of the epoch (items
 * when batch == 0). A DataLoader hands the rank's batch i out from worker
 * i mod nw (nw = max(workers, 1)) and every worker has the same number of
 * batches, so worker w has delivered consumed / nw batches, plus one if
 * w < consumed % nw. A resumed DataLoader asks worker 0 first again, so
 * DataLoader worker p->worker takes the role (the plan worker) of
 * (p->worker + consumed) mod nw: its first batch is then batch `consumed`
 * of the uninterrupted run and the rest follow in their original order.
 * Sets *role to that plan worker and *step to the step it continues from
 * (clamped to wh_plan_steps); use a plan with worker = *role for the items. */
void wh_plan_resume(const wh_plan_t *p, uint64_t consumed, uint32_t *role, uint64_t *step);

/* pi(seed, epoch)[i] over 0..n-1, computed without storing the permutation
 * (expected O(1)); the identity when !shuffle. Depends only on
 * (n, seed, epoch, shuffle). i >= n is reduced mod n; n == 0 gives 0. */
uint32_t wh_plan_perm(uint32_t n, uint64_t seed, uint64_t epoch, bool shuffle, uint32_t i);

/* The same permutation with its keys derived once, for callers that look up
 * many indices of one epoch. Plain value; copy freely. */
#define WH_PLAN_ROUNDS 8
typedef struct {
    uint32_t n;
    uint32_t bits; /* domain of the network: 2^bits >= n */
    bool shuffle;
    uint64_t key[WH_PLAN_ROUNDS];
} wh_plan_perm_t;

void wh_plan_perm_init(wh_plan_perm_t *pm, uint32_t n, uint64_t seed, uint64_t epoch, bool shuffle);
uint32_t wh_plan_perm_at(const wh_plan_perm_t *pm, uint32_t i);

/* wh_plan_item with the epoch's permutation already set up: pm must come from
 * wh_plan_perm_init(pm, p->swap_cap, p->seed, epoch, p->shuffle). */
void wh_plan_item_at(const wh_plan_t *p, const wh_plan_perm_t *pm, uint64_t k, uint32_t *pos,
                     bool *is_pad);

/* Spec mode (docs/reproducible.md): the seed of sample index k of a run,
 * the (k+1)-th output of SplitMix64 seeded with mix64(run_seed), where mix64
 * is SplitMix64's finaliser. Fixed for ever: runs are reproduced from it. */
uint64_t wh_spec_seed(uint64_t run_seed, uint64_t k);

#endif
