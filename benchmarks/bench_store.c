/* Throughput of the embedded shm store against plain memcpy, and seal time
 * against SWAP_CAP. One run prints markdown tables (benchmarks/README.md).
 *
 * For each sample size (4 MiB, 64 MiB; one uint8 field):
 *   baseline  memcpy of the same bytes from a private buffer into a warm,
 *             pre-faulted destination (and the same plus the consumer's
 *             touch of every byte, the baseline for reads)
 *   write     wh_store_put of the sample (copy into shm + XXH3), the
 *             generation sealed between puts when full (not timed)
 *   read      wh_store_read of one sealed sample (the same one every
 *             time, as the baseline copies the same bytes) into a warm
 *             destination handed out by the dest callback, then the
 *             consumer touches every byte; verify_reads on and off
 * Every figure is the median of --reps timed repetitions after warm-up
 * (all three generation areas written once, so page tables are populated
 * as in a long-running process). The operations compared are interleaved
 * repetition by repetition, so load from other processes hits them alike.
 *
 * Seal time: the median (and p99) of many seals of full generations of
 * small samples for SWAP_CAP 10 and 1000, timed around wh_store_seal.
 *
 * The store lives in /dev/shm under shm://whbench-<pid>; it is removed at
 * exit and on SIGINT/SIGTERM. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
/* libxxhash's run-time dispatched XXH3 (AVX2/AVX-512 where the CPU has
 * them), measured next to the default build for comparison only */
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define WH_BENCH_DISPATCH 1
#else
#define WH_BENCH_DISPATCH 0
#endif

#include "wh_store.h"

#define MIB (1024.0 * 1024.0)

static char g_uri[96];

static void bench_cleanup(void) {
    wh_store_config_t c = {.uri = g_uri};
    if (g_uri[0]) wh_store_clean(&c, NULL);
}

static void on_signal(int sig) {
    bench_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void die(const char *what, const wh_err_t *e) {
    fprintf(stderr, "bench_store: %s: %s\n", what, e ? e->message : "failed");
    exit(1);
}

static uint64_t now_ns(void) { return wh_now_mono_ns(); }

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t median(uint64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t pct(uint64_t *v, int n, double p) { /* v sorted */
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0; }

/* Page-aligned, pre-faulted (every page written) private buffer. */
static unsigned char *warm_buffer(size_t n, int fill) {
    void *p =
        mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) die("mmap", NULL);
    memset(p, fill, n);
    return p;
}

/* The consumer: reads every byte (8 at a time; the loop vectorises). */
static volatile uint64_t g_sink;
static uint64_t touch(const unsigned char *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        s += w;
    }
    g_sink += s;
    return s;
}

/* Destination callback: one warm buffer reused for every read. */
typedef struct {
    unsigned char *buf;
    size_t cap;
} dest_t;

static bool dest_cb(void *ctx, const wh_sample_meta_t *m, void **dst, wh_err_t *err) {
    dest_t *d = ctx;
    if (m->f[0].nbytes > d->cap) return wh_err_set(err, WH_E_INVALID, "sample larger than buffer");
    dst[0] = d->buf;
    return true;
}

typedef struct {
    const char *what;
    double size_mib;
    double gbs;
    double vs; /* ratio to the baseline named in base */
    const char *base;
} row_t;

static row_t g_rows[64];
static int g_nrows;

static void add_row(const char *what, double size_mib, double gbs, double base_gbs,
                    const char *base) {
    g_rows[g_nrows++] = (row_t){what, size_mib, gbs, base_gbs > 0 ? gbs / base_gbs : 0, base};
}

typedef struct {
    int reps;
    bool quick;
} opts_t;

static wh_schema_t one_field_schema(void) {
    static const char *const names[] = {"x"};
    wh_schema_t s;
    wh_err_t e;
    if (!wh_schema_init(&s, 1, names, &e)) die("schema", &e);
    return s;
}

static wh_store_config_t store_cfg(uint32_t swap_cap, uint64_t budget, bool verify) {
    wh_store_config_t c;
    memset(&c, 0, sizeof c);
    c.uri = g_uri;
    c.swap_cap = swap_cap;
    c.schema = one_field_schema();
    c.byte_budget = budget;
    c.lease_s = 60;
    c.verify_reads = verify;
    return c;
}

static uint32_t status_fill(wh_store_t *st) {
    wh_status_t s;
    wh_err_t e;
    if (!wh_store_status(st, &s, &e)) die("status", &e);
    return s.write_fill;
}

/* Puts one sample; when the generation is full, seals it (untimed) and
 * puts again. Returns the put's own time. */
static uint64_t timed_put(wh_store_t *st, const wh_array_t *a) {
    for (;;) {
        wh_put_status_t ps;
        wh_err_t e;
        uint64_t t0 = now_ns();
        if (!wh_store_put(st, a, 1, 1000, &ps, NULL, &e)) die("put", &e);
        uint64_t dt = now_ns() - t0;
        if (ps == WH_PUT_ACCEPTED) return dt;
        bool sealed;
        wh_seal_info_t info;
        if (!wh_store_seal(st, &sealed, &info, &e)) die("seal", &e);
        if (!sealed && ps == WH_PUT_DISCARDED) die("seal of a full generation refused", NULL);
    }
}

/* Everything one sample size's measurements need. */
typedef struct {
    size_t size;
    unsigned char *src, *dst;
    uint64_t want_sum;
    wh_store_t *wr, *rd[2]; /* rd[0] verify off, rd[1] verify on */
    uint64_t gen;
    wh_array_t a;
    dest_t d;
} ctx_t;

typedef uint64_t (*op_fn)(ctx_t *);

static void check_sum(ctx_t *c, uint64_t s) {
    if (s != c->want_sum) die("the consumer's sum does not match the data", NULL);
}

static uint64_t op_memcpy(ctx_t *c) {
    uint64_t t0 = now_ns();
    memcpy(c->dst, c->src, c->size);
    return now_ns() - t0;
}

static uint64_t op_memcpy_touch(ctx_t *c) {
    uint64_t t0 = now_ns();
    memcpy(c->dst, c->src, c->size);
    uint64_t s = touch(c->dst, c->size);
    uint64_t dt = now_ns() - t0;
    check_sum(c, s);
    return dt;
}

static uint64_t op_touch(ctx_t *c) {
    uint64_t t0 = now_ns();
    touch(c->dst, c->size);
    return now_ns() - t0;
}

/* XXH3 over size bytes as the store runs it: 128 KiB blocks that were
 * just written and still sit in L2 (wh_sample.c hashes block by block). */
#define BLOCK (128u * 1024u)
static uint64_t op_xxh3(ctx_t *c) {
    uint64_t t0 = now_ns();
    for (size_t done = 0; done < c->size; done += BLOCK) g_sink += XXH3_64bits(c->dst, BLOCK);
    return now_ns() - t0;
}

#if WH_BENCH_DISPATCH
static uint64_t op_xxh3_dispatch(ctx_t *c) {
    uint64_t t0 = now_ns();
    for (size_t done = 0; done < c->size; done += BLOCK)
        g_sink += XXH3_64bits_dispatch(c->dst, BLOCK);
    return now_ns() - t0;
}
#endif

static uint64_t read_op(ctx_t *c, int verify, bool touch_after) {
    wh_err_t e;
    uint64_t t0 = now_ns();
    if (!wh_store_read(c->rd[verify], c->gen, 0, dest_cb, &c->d, NULL, &e)) die("read", &e);
    uint64_t s = touch_after ? touch(c->dst, c->size) : 0;
    uint64_t dt = now_ns() - t0;
    if (touch_after) check_sum(c, s);
    return dt;
}
static uint64_t op_read_on_touch(ctx_t *c) { return read_op(c, 1, true); }
static uint64_t op_read_off_touch(ctx_t *c) { return read_op(c, 0, true); }
static uint64_t op_read_on(ctx_t *c) { return read_op(c, 1, false); }
static uint64_t op_read_off(ctx_t *c) { return read_op(c, 0, false); }
static uint64_t op_put(ctx_t *c) { return timed_put(c->wr, &c->a); }

/* Runs the ops interleaved (rotating their order each repetition) so that
 * load from other processes hits them alike; med[i] = median ns of op i. */
static void run_interleaved(ctx_t *c, op_fn *ops, int nops, int reps, uint64_t *med) {
    uint64_t *t = calloc((size_t)(nops * reps), sizeof *t);
    for (int w = 0; w < 2; w++) /* warm-up */
        for (int k = 0; k < nops; k++) ops[k](c);
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < nops; k++) {
            int i = (k + r) % nops;
            t[i * reps + r] = ops[i](c);
        }
    for (int i = 0; i < nops; i++) med[i] = median(t + i * reps, reps);
    free(t);
}

static void bench_size(size_t size, const opts_t *o) {
    const double mib = (double)size / MIB;
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.size = size;
    /* the source sits 192 bytes into a page, where a one-field sample's
     * data sits in the store (after its 192-byte header), so the baseline
     * copies with the same alignment as the store */
    unsigned char *src_map = warm_buffer(size + 4096, 0);
    c.src = src_map + 192;
    c.dst = warm_buffer(size, 1);
    for (size_t i = 0; i < size; i++) c.src[i] = (unsigned char)(i * 2654435761u >> 13);
    c.want_sum = touch(c.src, size);
    c.d = (dest_t){c.dst, size};

    /* the store: a few samples per generation for small sizes, one for
     * 64 MiB, so the segment stays at a few hundred MiB */
    uint32_t cap = size >= (32u << 20) ? 1 : 4;
    uint64_t budget = (uint64_t)cap * (size + 4096);
    wh_store_config_t cfg = store_cfg(cap, budget, true);
    wh_err_t e;
    bench_cleanup();
    c.wr = wh_store_open(&cfg, &e);
    if (!c.wr) die("open", &e);
    bool lead;
    if (!wh_store_lead(c.wr, &lead, &e) || !lead) die("lead", &e);
    c.a.dtype = WH_DT_U8;
    c.a.ndim = 1;
    c.a.shape[0] = (int64_t)size;
    c.a.strides[0] = 1;
    c.a.data = c.src;

    /* (a)+(b) memcpy and writes; the warm-up fills all three areas once */
    for (uint32_t w = 0; w < 3 * cap + 1; w++) timed_put(c.wr, &c.a);
    op_fn wops[] = {op_memcpy, op_put};
    uint64_t wmed[2];
    run_interleaved(&c, wops, 2, o->reps, wmed);

    /* a sealed generation that stays put (no more puts) */
    bool sealed;
    wh_seal_info_t info;
    while (status_fill(c.wr) < cap) timed_put(c.wr, &c.a);
    if (!wh_store_seal(c.wr, &sealed, &info, &e) || !sealed) die("final seal", &e);
    c.gen = info.generation;

    /* (c) reads, each verify setting through its own handle (its own
     * mapping, as a reader process would have) */
    for (int v = 0; v < 2; v++) {
        wh_store_config_t rc = store_cfg(cap, budget, v == 1);
        c.rd[v] = wh_store_open(&rc, &e);
        if (!c.rd[v]) die("open reader", &e);
    }
    op_fn rops[] = {op_memcpy_touch, op_read_on_touch, op_read_off_touch};
    uint64_t rmed[3];
    run_interleaved(&c, rops, 3, o->reps, rmed);
    op_fn bops[] = {
        op_memcpy,
        op_touch,
        op_xxh3,
        op_read_on,
        op_read_off,
#if WH_BENCH_DISPATCH
        op_xxh3_dispatch
#endif
    };
    int nb = (int)(sizeof bops / sizeof bops[0]);
    uint64_t bmed[6];
    run_interleaved(&c, bops, nb, o->reps, bmed);
    for (int v = 0; v < 2; v++) wh_store_destroy(c.rd[v]);
    wh_store_destroy(c.wr);
    bench_cleanup();

    double memcpy_gbs = gbps(size, wmed[0]), base_gbs = gbps(size, rmed[0]);
    add_row("memcpy into a warm buffer", mib, memcpy_gbs, memcpy_gbs, "memcpy");
    add_row("store write: wh_store_put", mib, gbps(size, wmed[1]), memcpy_gbs, "memcpy");
    add_row("memcpy + touch every byte", mib, base_gbs, base_gbs, "memcpy + touch");
    add_row("**store read + touch, verify on**", mib, gbps(size, rmed[1]), base_gbs,
            "memcpy + touch");
    add_row("**store read + touch, verify off**", mib, gbps(size, rmed[2]), base_gbs,
            "memcpy + touch");
    double bmemcpy = gbps(size, bmed[0]);
    add_row("breakdown: memcpy", mib, bmemcpy, bmemcpy, "memcpy");
    add_row("breakdown: store read, verify on, no touch", mib, gbps(size, bmed[3]), bmemcpy,
            "memcpy");
    add_row("breakdown: store read, verify off, no touch", mib, gbps(size, bmed[4]), bmemcpy,
            "memcpy");
    add_row("breakdown: touch alone", mib, gbps(size, bmed[1]), 0, "");
    add_row("breakdown: XXH3 of cached 128 KiB blocks, libxxhash default", mib, gbps(size, bmed[2]),
            0, "");
#if WH_BENCH_DISPATCH
    add_row("breakdown: XXH3 of cached 128 KiB blocks, libxxhash dispatch", mib,
            gbps(size, bmed[5]), 0, "");
#endif
    munmap(src_map, size + 4096);
    munmap(c.dst, size);
}

/* Seal time with SWAP_CAP cap: nseals seals of full generations. */
static void bench_seal(uint32_t cap, int nseals, uint64_t *med_ns, uint64_t *p99_ns,
                       uint64_t *info_med_ns) {
    static unsigned char small[64];
    uint64_t per = 64 + 96 + 64 + 64; /* header + descriptor, padded, + data */
    wh_store_config_t cfg = store_cfg(cap, (uint64_t)cap * per + 4096, true);
    wh_err_t e;
    bench_cleanup();
    wh_store_t *st = wh_store_open(&cfg, &e);
    if (!st) die("open", &e);
    bool lead;
    if (!wh_store_lead(st, &lead, &e) || !lead) die("lead", &e);
    wh_array_t a;
    memset(&a, 0, sizeof a);
    a.dtype = WH_DT_U8;
    a.ndim = 1;
    a.shape[0] = sizeof small;
    a.strides[0] = 1;
    a.data = small;
    uint64_t *t = calloc((size_t)nseals, sizeof *t), *ti = calloc((size_t)nseals, sizeof *ti);
    for (int i = -3; i < nseals; i++) { /* 3 untimed warm-up seals */
        for (uint32_t k = 0; k < cap; k++) {
            wh_put_status_t ps;
            if (!wh_store_put(st, &a, 1, 1000, &ps, NULL, &e) || ps != WH_PUT_ACCEPTED)
                die("seal bench put", &e);
        }
        bool sealed;
        wh_seal_info_t info;
        uint64_t t0 = now_ns();
        if (!wh_store_seal(st, &sealed, &info, &e) || !sealed) die("seal", &e);
        uint64_t dt = now_ns() - t0;
        if (i >= 0) {
            t[i] = dt;
            ti[i] = info.seal_ns;
        }
    }
    *med_ns = median(t, nseals);
    *p99_ns = pct(t, nseals, 0.99);
    *info_med_ns = median(ti, nseals);
    wh_store_destroy(st);
    bench_cleanup();
    free(t);
    free(ti);
}

/* The 1-minute load average, to tell a quiet run from a busy one. */
static void read_loadavg(char *out, size_t cap) {
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    double l1;
    if (fscanf(f, "%lf", &l1) == 1) snprintf(out, cap, "%.2f", l1);
    fclose(f);
}

int main(int argc, char **argv) {
    opts_t o = {.reps = 61, .quick = false};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            o.quick = true;
            o.reps = 7;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            o.reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--quick] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (o.reps < 1) o.reps = 1;
    snprintf(g_uri, sizeof g_uri, "shm://whbench-%d", (int)getpid());
    atexit(bench_cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    uint64_t t_start = now_ns();
    char load0[64] = "?";
    read_loadavg(load0, sizeof load0);
    size_t sizes[] = {4u << 20, 64u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) bench_size(sizes[i], &o);

    int nseal_small = o.quick ? 200 : 2000, nseal_big = o.quick ? 30 : 300;
    uint64_t med10, p99_10, inf10, med1000, p99_1000, inf1000;
    bench_seal(10, nseal_small, &med10, &p99_10, &inf10);
    bench_seal(1000, nseal_big, &med1000, &p99_1000, &inf1000);

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("### shm store vs memcpy (median of %d repetitions, %ld CPUs)\n\n", o.reps, ncpu);
    printf("| sample | operation | GB/s | vs baseline |\n");
    printf("|---:|---|---:|---|\n");
    for (int i = 0; i < g_nrows; i++) {
        row_t *r = &g_rows[i];
        if (r->base[0])
            printf("| %.0f MiB | %s | %.2f | %.0f%% of %s |\n", r->size_mib, r->what, r->gbs,
                   100.0 * r->vs, r->base);
        else
            printf("| %.0f MiB | %s | %.2f | |\n", r->size_mib, r->what, r->gbs);
    }
    printf("\n### seal time vs SWAP_CAP (wall time around wh_store_seal)\n\n");
    printf("| SWAP_CAP | seals | median | p99 | median reported by the store |\n");
    printf("|---:|---:|---:|---:|---:|\n");
    printf("| 10 | %d | %.2f us | %.2f us | %.2f us |\n", nseal_small, med10 / 1e3, p99_10 / 1e3,
           inf10 / 1e3);
    printf("| 1000 | %d | %.2f us | %.2f us | %.2f us |\n", nseal_big, med1000 / 1e3,
           p99_1000 / 1e3, inf1000 / 1e3);
    char load1[64] = "?";
    read_loadavg(load1, sizeof load1);
    printf("\nGB/s = 10^9 bytes per second. Whole run: %.1f s; load average %s at the start, "
           "%s at the end.\n",
           (double)(now_ns() - t_start) / 1e9, load0, load1);
    return 0;
}
