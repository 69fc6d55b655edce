/* Property tests for the DDP/DataLoader sample order (ext/core/wh_plan.c).
 * Plain C; prints "N passed, N failed" and exits non-zero on any failure.
 * Each test case (one configuration of the grid, one permutation check...)
 * counts once; the first failures are printed with their configuration. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wh_plan.h"

static unsigned long n_pass, n_fail;
static bool case_ok;
static char case_name[256];

static void case_begin(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void case_begin(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(case_name, sizeof case_name, fmt, ap);
    va_end(ap);
    case_ok = true;
}

static void case_end(void) {
    if (case_ok)
        n_pass++;
    else
        n_fail++;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (case_ok && n_fail < 25) {                                                          \
                fprintf(stderr, "FAIL [%s] line %d: %s: ", case_name, __LINE__, #cond);            \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
            case_ok = false;                                                                       \
        }                                                                                          \
    } while (0)

static const int pads[] = {WH_PAD_REPEAT, WH_PAD_IGNORE, WH_PAD_DROP};
static const char *pad_name[] = {"repeat", "ignore", "drop"};

/* ---- permutation ---------------------------------------------------- */

static bool is_bijection(uint32_t n, uint64_t seed, uint64_t epoch, bool shuffle,
                         unsigned char *seen) {
    memset(seen, 0, n);
    wh_plan_perm_t pm;
    wh_plan_perm_init(&pm, n, seed, epoch, shuffle);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = wh_plan_perm(n, seed, epoch, shuffle, i);
        if (v >= n || seen[v] || wh_plan_perm_at(&pm, i) != v) return false;
        seen[v] = 1;
    }
    return true;
}

static void test_perm_bijection(void) {
    static const uint64_t seeds[] = {0, 1, 0xdeadbeefULL, UINT64_MAX};
    static const uint64_t epochs[] = {0, 1, 7, 1000000007ULL};
    unsigned char *seen = malloc((1u << 21) + 16);
    if (!seen) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (uint32_t n = 1; n <= 1100; n++)
        for (size_t s = 0; s < WH_ARRAY_LEN(seeds); s++)
            for (size_t e = 0; e < WH_ARRAY_LEN(epochs); e++)
                for (int sh = 0; sh < 2; sh++) {
                    case_begin("perm bijection n=%u seed=%llu epoch=%llu shuffle=%d", n,
                               (unsigned long long)seeds[s], (unsigned long long)epochs[e], sh);
                    CHECK(is_bijection(n, seeds[s], epochs[e], sh, seen), "not a bijection");
                    if (!sh)
                        for (uint32_t i = 0; i < n; i++)
                            CHECK(wh_plan_perm(n, seeds[s], epochs[e], false, i) == i,
                                  "not identity at %u", i);
                    case_end();
                }
    static const uint32_t big[] = {1u << 20, (1u << 20) + 1, 1000003, (1u << 21) + 5};
    for (size_t b = 0; b < WH_ARRAY_LEN(big); b++) {
        case_begin("perm bijection n=%u", big[b]);
        CHECK(is_bijection(big[b], 42, 3, true, seen), "not a bijection");
        case_end();
    }
    free(seen);

    /* The largest n: outputs in range, distinct inputs give distinct outputs. */
    case_begin("perm n=UINT32_MAX");
    enum {
        M = 4096
    };
    static uint32_t out[M];
    uint32_t n = UINT32_MAX;
    for (uint32_t i = 0; i < M; i++) {
        uint32_t in = i < M / 2 ? i : n - 1 - (i - M / 2);
        out[i] = wh_plan_perm(n, 9, 9, true, in);
        CHECK(out[i] < n, "out of range: %u", out[i]);
        for (uint32_t j = 0; j < i; j++) CHECK(out[j] != out[i], "collision %u %u", j, i);
    }
    case_end();

    case_begin("perm edge cases");
    CHECK(wh_plan_perm(0, 1, 2, true, 5) == 0, "n=0");
    CHECK(wh_plan_perm(1, 1, 2, true, 0) == 0, "n=1");
    for (uint32_t i = 0; i < 50; i++)
        CHECK(wh_plan_perm(17, 3, 4, true, i + 17) == wh_plan_perm(17, 3, 4, true, i),
              "i >= n not reduced mod n at %u", i);
    case_end();
}

static bool same_order(uint32_t n, uint64_t s1, uint64_t e1, uint64_t s2, uint64_t e2) {
    for (uint32_t i = 0; i < n; i++)
        if (wh_plan_perm(n, s1, e1, true, i) != wh_plan_perm(n, s2, e2, true, i)) return false;
    return true;
}

static void test_perm_varies(void) {
    enum {
        E = 6
    };
    for (uint32_t n = 8; n <= 64; n++)
        for (uint64_t seed = 0; seed < 4; seed++) {
            case_begin("epochs differ n=%u seed=%llu", n, (unsigned long long)seed);
            for (uint64_t e = 0; e < E; e++) {
                bool ident = true;
                for (uint32_t i = 0; i < n; i++) ident &= wh_plan_perm(n, seed, e, true, i) == i;
                CHECK(!ident, "shuffled order of epoch %llu is the identity",
                      (unsigned long long)e);
                for (uint64_t f = e + 1; f < E; f++)
                    CHECK(!same_order(n, seed, e, seed, f),
                          "epochs %llu and %llu give the same order", (unsigned long long)e,
                          (unsigned long long)f);
                CHECK(!same_order(n, seed, e, seed + 1, e),
                      "seeds %llu and %llu give the same order", (unsigned long long)seed,
                      (unsigned long long)seed + 1);
                /* (seed, epoch) and (seed+1, epoch-1) must not share keys. */
                if (e > 0)
                    CHECK(!same_order(n, seed, e, seed + 1, e - 1), "(seed, epoch) aliasing");
            }
            case_end();
        }
}

/* Over many epochs, where each index lands must look uniform: chi-square of
 * the n x n table of (index, position) counts against its expectation, bound
 * at about six standard deviations above its mean. A weak round function on
 * small domains (few bits per half) shows up here. */
static void test_perm_uniform(void) {
    static const uint32_t ns[] = {2, 3, 5, 8, 13, 16, 33, 64};
    for (size_t t = 0; t < WH_ARRAY_LEN(ns); t++) {
        uint32_t n = ns[t];
        uint64_t epochs = 256ull * n;
        static uint32_t cnt[64][64];
        memset(cnt, 0, sizeof cnt);
        for (uint64_t e = 0; e < epochs; e++) {
            wh_plan_perm_t pm;
            wh_plan_perm_init(&pm, n, 12345, e, true);
            for (uint32_t i = 0; i < n; i++) cnt[i][wh_plan_perm_at(&pm, i)]++;
        }
        double expect = (double)epochs / n, chi = 0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t v = 0; v < n; v++) {
                double d = cnt[i][v] - expect;
                chi += d * d / expect;
            }
        double dof = (double)(n - 1) * (n - 1);
        double bound = dof + 6 * __builtin_sqrt(2 * dof) + 10;
        case_begin("perm uniform n=%u", n);
        CHECK(chi < bound, "chi-square %.1f over bound %.1f (dof %.0f)", chi, bound, dof);
        case_end();
    }
}

/* ---- validation ----------------------------------------------------- */

static wh_plan_t good(void) {
    wh_plan_t p = {.swap_cap = 10,
                   .world = 2,
                   .rank = 1,
                   .workers = 3,
                   .worker = 2,
                   .batch = 4,
                   .shuffle = true,
                   .seed = 7,
                   .pad = WH_PAD_REPEAT};
    return p;
}

static void expect_bad(const wh_plan_t *p, const char *what, const char *word) {
    wh_err_t err = {0};
    case_begin("check rejects %s", what);
    CHECK(!wh_plan_check(p, &err), "accepted");
    CHECK(err.code == WH_E_INVALID, "code %d", err.code);
    CHECK(strstr(err.message, word) != NULL, "message '%s' does not name '%s'", err.message, word);
    CHECK(!wh_plan_check(p, NULL), "accepted with err NULL");
    case_end();
}

static void test_check(void) {
    wh_plan_t p = good();
    wh_err_t err = {0};
    case_begin("check accepts a good plan");
    CHECK(wh_plan_check(&p, &err), "%s", err.message);
    CHECK(wh_plan_check(&p, NULL), "err NULL");
    p.workers = 0;
    p.worker = 0;
    CHECK(wh_plan_check(&p, NULL), "workers 0 worker 0");
    p = good();
    p.swap_cap = WH_SWAP_CAP_MAX;
    p.world = 65536;
    p.workers = 65535;
    p.batch = UINT32_MAX;
    CHECK(wh_plan_check(&p, &err), "large but valid: %s", err.message);
    case_end();

    expect_bad(NULL, "NULL plan", "plan");
    p = good(), p.swap_cap = 0, expect_bad(&p, "swap_cap 0", "swap_cap");
    p = good(), p.swap_cap = WH_SWAP_CAP_MAX + 1, expect_bad(&p, "swap_cap 2**30+1", "swap_cap");
    p = good(), p.world = 0, p.rank = 0, expect_bad(&p, "world 0", "world");
    p = good(), p.rank = 2, expect_bad(&p, "rank == world", "rank");
    p = good(), p.worker = 3, expect_bad(&p, "worker == workers", "worker");
    p = good(), p.workers = 0, p.worker = 1, expect_bad(&p, "worker 1 with workers 0", "worker");
    p = good(), p.pad = 3, expect_bad(&p, "pad 3", "pad");
    p = good(), p.pad = -1, expect_bad(&p, "pad -1", "pad");
    p = good(), p.swap_cap = WH_SWAP_CAP_MAX, p.world = UINT32_MAX, p.rank = 0,
    p.workers = UINT32_MAX, p.worker = 0, p.batch = UINT32_MAX;
    expect_bad(&p, "64-bit overflow", "overflow");
}

/* ---- worked examples -------------------------------------------------- */

static void test_examples(void) {
    /* N=10, 3 ranks, in-process: W=3, ceil 4, floor 3. */
    wh_plan_t p = {.swap_cap = 10,
                   .world = 3,
                   .rank = 1,
                   .workers = 0,
                   .worker = 0,
                   .batch = 0,
                   .shuffle = false,
                   .seed = 0,
                   .pad = WH_PAD_REPEAT};
    case_begin("example N=10 world=3");
    CHECK(wh_plan_steps(&p) == 4, "%llu", (unsigned long long)wh_plan_steps(&p));
    static const uint32_t want[] = {1, 4, 7, 0};
    for (uint64_t k = 0; k < 4; k++) {
        uint32_t pos;
        bool pad;
        wh_plan_item(&p, 0, k, &pos, &pad);
        CHECK(pos == want[k] && pad == (k == 3), "k=%llu pos=%u pad=%d", (unsigned long long)k, pos,
              pad);
    }
    p.batch = 3;
    CHECK(wh_plan_steps(&p) == 6, "batch 3: %llu", (unsigned long long)wh_plan_steps(&p));
    CHECK(wh_plan_rank_batches(&p) == 2, "batch 3: %llu",
          (unsigned long long)wh_plan_rank_batches(&p));
    p.pad = WH_PAD_DROP;
    CHECK(wh_plan_steps(&p) == 3, "drop: %llu", (unsigned long long)wh_plan_steps(&p));
    CHECK(wh_plan_rank_batches(&p) == 1, "drop: %llu",
          (unsigned long long)wh_plan_rank_batches(&p));
    p.batch = 2;
    CHECK(wh_plan_rank_batches(&p) == 2, "drop, partial last batch");
    p.batch = 0;
    CHECK(wh_plan_rank_batches(&p) == 0, "batch 0");
    CHECK(wh_plan_rank_items(&p) == 3, "items");
    /* 2 ranks x 2 workers, batch 4: c = 3 -> 4 steps; each rank 2 batches. */
    wh_plan_t q = {.swap_cap = 10,
                   .world = 2,
                   .rank = 0,
                   .workers = 2,
                   .worker = 1,
                   .batch = 4,
                   .shuffle = true,
                   .seed = 3,
                   .pad = WH_PAD_IGNORE};
    CHECK(wh_plan_steps(&q) == 4, "%llu", (unsigned long long)wh_plan_steps(&q));
    CHECK(wh_plan_rank_batches(&q) == 2, "%llu", (unsigned long long)wh_plan_rank_batches(&q));
    CHECK(wh_plan_rank_items(&q) == 8, "%llu", (unsigned long long)wh_plan_rank_items(&q));
    /* SWAP_CAP 10, batch 32: one worker pads 22 of 32 items (69%), two
     * workers 54 of 64 (84%); drop_last keeps no batch at all. */
    wh_plan_t b32 = {.swap_cap = 10, .world = 1, .workers = 0, .batch = 32, .pad = WH_PAD_REPEAT};
    CHECK(wh_plan_steps(&b32) == 32 && wh_plan_rank_pads(&b32) == 22, "batch 32: %llu pads",
          (unsigned long long)wh_plan_rank_pads(&b32));
    b32.workers = 2;
    CHECK(wh_plan_rank_items(&b32) == 64 && wh_plan_rank_pads(&b32) == 54, "2 workers: %llu pads",
          (unsigned long long)wh_plan_rank_pads(&b32));
    b32.drop_last = true;
    CHECK(wh_plan_steps(&b32) == 0 && wh_plan_rank_batches(&b32) == 0, "drop_last: %llu steps",
          (unsigned long long)wh_plan_steps(&b32));
    b32.workers = 0;
    b32.batch = 4;
    CHECK(wh_plan_steps(&b32) == 8 && wh_plan_rank_pads(&b32) == 0, "drop_last batch 4: %llu",
          (unsigned long long)wh_plan_steps(&b32));
    /* Past the end: a valid position, marked as padding. */
    q.pad = WH_PAD_DROP;
    for (uint64_t k = 2; k < 1000; k += 7) {
        uint32_t pos;
        bool pad;
        wh_plan_item(&q, 5, k, &pos, &pad);
        CHECK(pos < 10 && pad, "k=%llu past the end: pos=%u pad=%d", (unsigned long long)k, pos,
              pad);
    }
    uint32_t pos = UINT32_MAX;
    bool pad = false;
    wh_plan_item(&q, 5, UINT64_MAX, &pos, &pad);
    CHECK(pos < 10 && pad, "k=UINT64_MAX: pos=%u pad=%d", pos, pad);
    case_end();
}

/* ---- the grid ----------------------------------------------------------- */

enum {
    NMAX = 64
};

/* One epoch of one configuration across every rank and worker. */
static void grid_case(uint32_t N, uint32_t world, uint32_t workers, uint32_t batch, int pad,
                      bool drop_last, bool shuffle, uint64_t seed, uint64_t epoch) {
    uint32_t nw = workers ? workers : 1;
    uint64_t W = (uint64_t)world * nw;
    unsigned count[NMAX] = {0};
    uint64_t real = 0, pads_n = 0;
    /* Reference order by global index, taken from a plan with W = 1. */
    uint32_t ref[NMAX];
    wh_plan_t one = {.swap_cap = N,
                     .world = 1,
                     .rank = 0,
                     .workers = 0,
                     .worker = 0,
                     .batch = 0,
                     .shuffle = shuffle,
                     .seed = seed,
                     .pad = WH_PAD_REPEAT};
    for (uint32_t j = 0; j < N; j++) {
        bool ip;
        wh_plan_item(&one, epoch, j, &ref[j], &ip);
    }

    case_begin(
        "N=%u world=%u workers=%u batch=%u pad=%s drop_last=%d shuffle=%d seed=%llu epoch=%llu", N,
        world, workers, batch, pad_name[pad], drop_last, shuffle, (unsigned long long)seed,
        (unsigned long long)epoch);
    uint64_t steps0 = 0;
    wh_plan_perm_t pm;
    wh_plan_perm_init(&pm, N, seed, epoch, shuffle);
    for (uint32_t r = 0; r < world; r++) {
        uint64_t rank_sum_batches = 0, rank_sum_items = 0;
        uint64_t rb = 0, pads_rank = 0;
        for (uint32_t w = 0; w < nw; w++) {
            wh_plan_t p = {.swap_cap = N,
                           .world = world,
                           .rank = r,
                           .workers = workers,
                           .worker = w,
                           .batch = batch,
                           .shuffle = shuffle,
                           .seed = seed,
                           .pad = pad,
                           .drop_last = drop_last};
            wh_err_t err = {0};
            CHECK(wh_plan_check(&p, &err), "check: %s", err.message);
            uint64_t steps = wh_plan_steps(&p);
            if (r == 0 && w == 0) steps0 = steps;
            CHECK(steps == steps0, "rank %u worker %u: %llu steps, worker 0 has %llu", r, w,
                  (unsigned long long)steps, (unsigned long long)steps0);
            if (batch && (pad != WH_PAD_DROP || drop_last))
                CHECK(steps % batch == 0, "steps %llu not whole batches",
                      (unsigned long long)steps);
            uint64_t g = (uint64_t)r * nw + w;
            for (uint64_t k = 0; k < steps; k++) {
                uint32_t pos = UINT32_MAX, pos2 = UINT32_MAX;
                bool is_pad = false, is_pad2 = true;
                wh_plan_item(&p, epoch, k, &pos, &is_pad);
                wh_plan_item_at(&p, &pm, k, &pos2, &is_pad2);
                CHECK(pos == pos2 && is_pad == is_pad2, "item_at differs from item");
                uint64_t j = g + k * W;
                CHECK(pos < N, "position %u out of range", pos);
                CHECK(is_pad == (j >= N), "g=%llu k=%llu: is_pad=%d", (unsigned long long)g,
                      (unsigned long long)k, is_pad);
                if (pos >= N) continue;
                if (is_pad) {
                    pads_n++;
                    pads_rank++;
                    CHECK(pos == ref[j % N], "pad repeats %u, want %u", pos, ref[j % N]);
                } else {
                    real++;
                    count[pos]++;
                    /* The order is the same for every W. */
                    CHECK(pos == ref[j], "g=%llu k=%llu: position %u, W=1 order has %u",
                          (unsigned long long)g, (unsigned long long)k, pos, ref[j]);
                }
            }
            if (batch) rank_sum_batches += (steps + batch - 1) / batch;
            rank_sum_items += steps;
            rb = wh_plan_rank_batches(&p);
            CHECK(wh_plan_rank_items(&p) == steps * nw, "rank_items");

            /* Resume: after the rank consumed b batches (round robin over
             * workers), the resumed DataLoader asks worker 0 first; the
             * worker that played role (w + b) mod nw before goes on, so
             * the rank's batches follow in their original order. */
            uint64_t unit = batch ? batch : 1;
            uint64_t my_units = (steps + unit - 1) / unit;
            for (uint64_t b = 0; b <= my_units * nw + 2; b++) {
                uint32_t role = UINT32_MAX;
                uint64_t at = UINT64_MAX;
                wh_plan_resume(&p, b, &role, &at);
                CHECK(role == (w + b) % nw, "resume after %llu: role %u", (unsigned long long)b,
                      role);
                uint64_t mine = 0; /* round-robin slots i < b with i mod nw == role */
                for (uint64_t i = role; i < b; i += nw) mine++;
                uint64_t want = mine * unit < steps ? mine * unit : steps;
                CHECK(at == want, "resume after %llu: %llu, want %llu", (unsigned long long)b,
                      (unsigned long long)at, (unsigned long long)want);
            }
        }
        /* A resumed DataLoader: workers asked round robin from worker 0,
         * one skipped once it has no unit left. Its sequence of (role,
         * unit) must be the uninterrupted run's units b, b+1, ... (unit i
         * from role i mod nw, that role's unit i / nw). */
        {
            wh_plan_t p0 = {.swap_cap = N,
                            .world = world,
                            .rank = r,
                            .workers = workers,
                            .batch = batch,
                            .shuffle = shuffle,
                            .seed = seed,
                            .pad = pad,
                            .drop_last = drop_last};
            uint64_t unit = batch ? batch : 1, steps = wh_plan_steps(&p0);
            uint64_t per = (steps + unit - 1) / unit, total = per * nw;
            for (uint64_t b = 0; b <= total; b++) {
                uint32_t role[4];
                uint64_t next[4];
                for (uint32_t v = 0; v < nw; v++) {
                    wh_plan_t q = p0;
                    q.worker = v;
                    wh_plan_resume(&q, b, &role[v], &next[v]);
                    next[v] =
                        (next[v] + unit - 1) / unit; /* a clamped partial unit counts as taken */
                }
                uint64_t i = b, guard = 0;
                for (uint32_t v = 0; i < total && guard < 4 * total + 8;
                     v = (v + 1) % nw, guard++) {
                    if (next[v] >= per) continue;
                    CHECK(role[v] == i % nw && next[v] == i / nw,
                          "resume after %llu: unit %llu came from role %u unit %llu",
                          (unsigned long long)b, (unsigned long long)i, role[v],
                          (unsigned long long)next[v]);
                    next[v]++;
                    i++;
                }
                CHECK(i == total, "resume after %llu: %llu of %llu units", (unsigned long long)b,
                      (unsigned long long)i, (unsigned long long)total);
                for (uint32_t v = 0; v < nw; v++)
                    CHECK(next[v] >= per, "resume after %llu: worker %u has units left",
                          (unsigned long long)b, v);
            }
        }
        CHECK(wh_plan_rank_pads(&(wh_plan_t){.swap_cap = N,
                                             .world = world,
                                             .rank = r,
                                             .workers = workers,
                                             .batch = batch,
                                             .shuffle = shuffle,
                                             .seed = seed,
                                             .pad = pad,
                                             .drop_last = drop_last}) == pads_rank,
              "rank %u: rank_pads, want %llu", r, (unsigned long long)pads_rank);
        if (batch)
            CHECK(rb == rank_sum_batches, "rank %u: rank_batches %llu, sum over workers %llu", r,
                  (unsigned long long)rb, (unsigned long long)rank_sum_batches);
        else
            CHECK(rb == 0, "rank_batches without batch");
        (void)rank_sum_items;
    }
    uint64_t c = pad == WH_PAD_DROP ? N / W : (N + W - 1) / W;
    if (batch && drop_last) {
        /* Whole batches only: each worker keeps floor(c / batch) of them. */
        for (uint32_t v = 0; v < N; v++)
            CHECK(count[v] <= 1, "position %u seen %u times", v, count[v]);
        CHECK(steps0 == c / batch * batch, "drop_last steps %llu, want %llu",
              (unsigned long long)steps0, (unsigned long long)(c / batch * batch));
        CHECK(real + pads_n == steps0 * W, "items");
        if (pad == WH_PAD_DROP) CHECK(pads_n == 0, "drop yields padding");
    } else if (pad == WH_PAD_DROP) {
        for (uint32_t v = 0; v < N; v++)
            CHECK(count[v] <= 1, "position %u seen %u times", v, count[v]);
        CHECK(real == N / W * W, "drop: %llu real items, want %llu", (unsigned long long)real,
              (unsigned long long)(N / W * W));
        CHECK(pads_n == 0, "drop yields padding");
        CHECK(steps0 == N / W, "drop steps %llu, want %llu", (unsigned long long)steps0,
              (unsigned long long)(N / W));
    } else {
        for (uint32_t v = 0; v < N; v++)
            CHECK(count[v] == 1, "position %u seen %u times", v, count[v]);
        CHECK(real == N, "%llu real items", (unsigned long long)real);
        /* Padding only fills the last round (and whole batches). */
        uint64_t steps = batch ? (c + batch - 1) / batch * batch : c;
        CHECK(steps0 == steps, "steps %llu, want %llu", (unsigned long long)steps0,
              (unsigned long long)steps);
        CHECK(pads_n == steps * W - N, "%llu padding items, want %llu", (unsigned long long)pads_n,
              (unsigned long long)(steps * W - N));
    }
    case_end();
}

static void test_grid(void) {
    static const uint64_t seeds[] = {0, 0x5eed5eed5eedULL};
    static const uint64_t epochs[] = {0, 1, 41};
    for (uint32_t N = 1; N <= NMAX; N++)
        for (uint32_t world = 1; world <= 4; world++)
            for (uint32_t workers = 0; workers <= 3; workers++)
                for (uint32_t batch = 0; batch <= 5; batch++)
                    for (size_t pi = 0; pi < WH_ARRAY_LEN(pads); pi++)
                        for (int sh = 0; sh < 2; sh++)
                            for (int dl = 0; dl < 2; dl++)
                                for (size_t s = 0; s < WH_ARRAY_LEN(seeds); s++)
                                    for (size_t e = 0; e < WH_ARRAY_LEN(epochs); e++)
                                        grid_case(N, world, workers, batch, pads[pi], dl, sh,
                                                  seeds[s], epochs[e]);
}

/* wh_spec_seed is SplitMix64 (docs/reproducible.md): its first outputs for
 * seed 0 are published values, and mix64(0) is 0, so RUN_SEED 0 gives them. */
static void test_spec_seed(void) {
    static const uint64_t splitmix0[] = {0xe220a8397b1dcdafULL, 0x6e789e6aa1b965f4ULL,
                                         0x06c45d188009454fULL};
    for (uint64_t k = 0; k < 3; k++) {
        case_begin("spec_seed(0, %llu)", (unsigned long long)k);
        CHECK(wh_spec_seed(0, k) == splitmix0[k], "got %016llx",
              (unsigned long long)wh_spec_seed(0, k));
        case_end();
    }
    case_begin("spec_seed differs by run_seed and index");
    CHECK(wh_spec_seed(1, 0) != wh_spec_seed(0, 0) && wh_spec_seed(1, 0) != wh_spec_seed(0, 1),
          "collision");
    case_end();
}

int main(void) {
    test_check();
    test_spec_seed();
    test_examples();
    test_perm_bijection();
    test_perm_varies();
    test_perm_uniform();
    test_grid();
    printf("%lu passed, %lu failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
