/* wirehead_torch: sample order for DDP ranks and DataLoader workers.
 * See wh_plan.h for the rule. Pure functions: no allocation, no globals. */
#include "wh_plan.h"

/* Why a keyed Feistel network with cycle walking:
 * - The "every position exactly once per epoch" guarantee for any W needs a
 *   true bijection of 0..N-1; a hash of the index would collide.
 * - Storing the permutation (Fisher-Yates) costs O(N) memory and O(N) work
 *   in every worker of every rank at every epoch; the network needs only its
 *   round keys, and any index is looked up on its own in expected O(1), so a
 *   resumed worker jumps straight to its step.
 * - A Feistel network is a bijection whatever its round function, so the
 *   guarantee does not rest on the quality of the mixing. It runs over the
 *   smallest power of two >= N (less than 2N), and values that land outside
 *   0..N-1 are walked along the permutation's cycle until one lands inside:
 *   that restriction is again a bijection of 0..N-1, and the walk takes fewer
 *   than two steps on average.
 * - Keys come from (seed, epoch) alone through splitmix64, never from W, so
 *   the order is the same in every process, generation and world size. */

static inline uint64_t wh__mix64(uint64_t z) {
    /* splitmix64 finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define WH__GOLDEN 0x9e3779b97f4a7c15ULL

uint64_t wh_spec_seed(uint64_t run_seed, uint64_t k) {
    return wh__mix64(wh__mix64(run_seed) + (k + 1) * WH__GOLDEN);
}

static inline uint64_t wh__nw(const wh_plan_t *p) { return p->workers ? p->workers : 1; }

void wh_plan_perm_init(wh_plan_perm_t *pm, uint32_t n, uint64_t seed, uint64_t epoch,
                       bool shuffle) {
    pm->n = n;
    pm->shuffle = shuffle;
    uint32_t bits = 0;
    while (bits < 32 && ((uint64_t)1 << bits) < n) bits++;
    pm->bits = bits;
    /* splitmix64 stream seeded by (seed, epoch): epoch is mixed on its own
     * first so that (seed, epoch) and (seed + 1, epoch - 1) do not share keys. */
    uint64_t state = seed ^ wh__mix64(epoch + WH__GOLDEN);
    for (int r = 0; r < WH_PLAN_ROUNDS; r++) {
        state += WH__GOLDEN;
        pm->key[r] = wh__mix64(state);
    }
}

/* One pass of the network over `bits` bits. The value is split into a high
 * part of hw bits and a low part of lw bits (hw + lw = bits, unequal when bits
 * is odd); a round maps (hi, lo) to (lo, hi ^ F(lo)), which swaps the widths.
 * Each round is invertible, so the whole pass is a bijection of 0..2^bits-1. */
static uint64_t wh__feistel(const wh_plan_perm_t *pm, uint64_t x) {
    unsigned hw = pm->bits / 2, lw = pm->bits - hw;
    uint64_t hi = x >> lw, lo = x & (((uint64_t)1 << lw) - 1);
    for (int r = 0; r < WH_PLAN_ROUNDS; r++) {
        /* High bits of the mix are the best mixed; hw == 0 takes none. */
        uint64_t f = hw ? wh__mix64(lo ^ pm->key[r]) >> (64 - hw) : 0;
        uint64_t nlo = hi ^ f;
        hi = lo;
        lo = nlo;
        unsigned t = hw;
        hw = lw;
        lw = t;
    }
    return (hi << lw) | lo;
}

uint32_t wh_plan_perm_at(const wh_plan_perm_t *pm, uint32_t i) {
    if (pm->n == 0) return 0;
    if (i >= pm->n) i %= pm->n;
    if (!pm->shuffle || pm->n == 1) return i;
    /* Cycle walking: starting inside 0..n-1, the cycle returns to i itself,
     * so the loop ends within the cycle's length (fewer than 2 steps
     * expected, since 2^bits < 2n). */
    uint64_t x = i;
    do x = wh__feistel(pm, x);
    while (x >= pm->n);
    return (uint32_t)x;
}

uint32_t wh_plan_perm(uint32_t n, uint64_t seed, uint64_t epoch, bool shuffle, uint32_t i) {
    wh_plan_perm_t pm;
    wh_plan_perm_init(&pm, n, seed, epoch, shuffle);
    return wh_plan_perm_at(&pm, i);
}

bool wh_plan_check(const wh_plan_t *p, wh_err_t *err) {
    if (!p) return wh_err_set(err, WH_E_INVALID, "sample plan: no plan given");
    if (!wh_swap_cap_check(p->swap_cap, "sample plan: swap_cap (SWAP_CAP)", err)) return false;
    if (p->world < 1)
        return wh_err_set(err, WH_E_INVALID, "sample plan: world (WORLD_SIZE) must be >= 1, got %u",
                          p->world);
    if (p->rank >= p->world)
        return wh_err_set(
            err, WH_E_INVALID,
            "sample plan: rank (RANK) %u out of range for world size %u (need rank < world)",
            p->rank, p->world);
    uint64_t nw = wh__nw(p);
    if (p->worker >= nw)
        return wh_err_set(err, WH_E_INVALID,
                          "sample plan: worker id %u out of range for %u DataLoader workers "
                          "(need worker < max(workers, 1))",
                          p->worker, p->workers);
    if (p->pad != WH_PAD_REPEAT && p->pad != WH_PAD_IGNORE && p->pad != WH_PAD_DROP)
        return wh_err_set(err, WH_E_INVALID,
                          "sample plan: pad mode %d unknown (0 repeat, 1 ignore, 2 drop)", p->pad);
    /* Indices g + k*W must fit in 64 bits for every step k. */
    uint64_t W = (uint64_t)p->world * nw, last;
    if (!wh_mul_ok(wh_plan_steps(p), W, &last))
        return wh_err_set(
            err, WH_E_INVALID,
            "sample plan: swap_cap %u, batch %u and %llu global workers overflow 64-bit indices",
            p->swap_cap, p->batch, (unsigned long long)W);
    return true;
}

uint64_t wh_plan_steps(const wh_plan_t *p) {
    uint64_t N = p->swap_cap, W = (uint64_t)p->world * wh__nw(p);
    uint64_t c = p->pad == WH_PAD_DROP ? N / W : (N + W - 1) / W;
    if (p->batch > 0 && p->drop_last)
        c = c / p->batch * p->batch;
    else if (p->batch > 0 && p->pad != WH_PAD_DROP)
        c = (c + p->batch - 1) / p->batch * p->batch;
    return c;
}

void wh_plan_item(const wh_plan_t *p, uint64_t epoch, uint64_t k, uint32_t *pos, bool *is_pad) {
    wh_plan_perm_t pm;
    wh_plan_perm_init(&pm, p->swap_cap, p->seed, epoch, p->shuffle);
    wh_plan_item_at(p, &pm, k, pos, is_pad);
}

void wh_plan_item_at(const wh_plan_t *p, const wh_plan_perm_t *pm, uint64_t k, uint32_t *pos,
                     bool *is_pad) {
    uint64_t N = p->swap_cap, nw = wh__nw(p);
    uint64_t W = (uint64_t)p->world * nw;
    uint64_t g = (uint64_t)p->rank * nw + p->worker;
    bool real = false;
    uint64_t j = 0;
    if (k < wh_plan_steps(p)) {
        /* k < steps and wh_plan_check bound steps * W, so no overflow. */
        j = g + k * W;
        real = j < N;
    }
    if (!real) {
        /* Padding repeats pi[(g + k*W) mod N], reduced piecewise so that any
         * k (even one past the end) stays in range without overflow. */
        j = (g % N + (k % N) * (W % N)) % N;
    }
    *pos = wh_plan_perm_at(pm, (uint32_t)j);
    *is_pad = !real;
}

uint64_t wh_plan_rank_items(const wh_plan_t *p) { return wh_plan_steps(p) * wh__nw(p); }

uint64_t wh_plan_rank_batches(const wh_plan_t *p) {
    if (p->batch == 0) return 0;
    uint64_t s = wh_plan_steps(p);
    return (s + p->batch - 1) / p->batch * wh__nw(p);
}

uint64_t wh_plan_rank_pads(const wh_plan_t *p) {
    uint64_t N = p->swap_cap, nw = wh__nw(p), W = (uint64_t)p->world * nw;
    uint64_t steps = wh_plan_steps(p), pads = 0;
    for (uint64_t w = 0; w < nw; w++) {
        /* Worker g's step k is real while g + k*W < N: ceil((N - g) / W) steps. */
        uint64_t g = (uint64_t)p->rank * nw + w;
        uint64_t real = g < N ? (N - g + W - 1) / W : 0;
        pads += steps > real ? steps - real : 0;
    }
    return pads;
}

void wh_plan_resume(const wh_plan_t *p, uint64_t consumed, uint32_t *role, uint64_t *step) {
    uint64_t nw = wh__nw(p), b = p->batch ? p->batch : 1;
    uint64_t r = (p->worker + consumed % nw) % nw;
    uint64_t mine = consumed / nw + (r < consumed % nw ? 1 : 0);
    uint64_t steps = wh_plan_steps(p);
    *role = (uint32_t)r;
    /* mine * b can only exceed steps (or overflow) past the epoch's end. */
    *step = (mine > steps / b + 1 || mine * b > steps) ? steps : mine * b;
}
