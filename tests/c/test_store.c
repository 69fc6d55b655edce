/* C-level tests of the sample format (ext/core/wh_sample.c) and the embedded
 * shared-memory store (ext/shm/), driven without Python.
 *
 * Every store gets a unique name (shm://whctest-<pid>-<n>) and is removed
 * at the end of its test case, pass or fail; all of them again at exit and
 * on SIGINT/SIGTERM/SIGHUP/SIGPIPE or when a case's 180 s watchdog fires.
 * Children are forked for the crash scenarios (a leader that exits holding
 * the lease, a generator SIGKILLed inside a put); each opens the store
 * after fork, and every child is killed and reaped by the end of its case.
 * With arguments, runs only the cases whose names contain one of them.
 * Prints "N passed, N failed" last; exits non-zero on any failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "wh_sample.h"
#include "wh_shm.h"
#include "wh_store.h"
#include "wh_ring.h"

/* ---- test bookkeeping ------------------------------------------------ */

static unsigned n_pass, n_fail;
static bool case_ok;
static const char *case_name = "";

static void fail_at(int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_at(int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "FAIL [%s] line %d: %s: ", case_name, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    case_ok = false;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) fail_at(__LINE__, #cond, __VA_ARGS__);                                        \
    } while (0)

/* Like CHECK, and stops the current test case (jumps to its out: label). */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fail_at(__LINE__, #cond, __VA_ARGS__);                                                 \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Stores and children this process made, for clean-up from anywhere. */
#define MAX_STORES 64
#define MAX_KIDS 16
static char g_uris[MAX_STORES][96];
static int g_nstores;
static volatile pid_t g_kids[MAX_KIDS];
static int g_store_seq;

static const char *new_uri(void) {
    if (g_nstores >= MAX_STORES) {
        fprintf(stderr, "test_store: too many stores\n");
        exit(2);
    }
    char *u = g_uris[g_nstores++];
    snprintf(u, sizeof g_uris[0], "shm://whctest-%d-%d", (int)getpid(), g_store_seq++);
    return u;
}

/* The segment of a store: shm name "/wirehead.NAME" (wh_shm_files). */
static void seg_name(const char *uri, char *out, size_t cap) {
    snprintf(out, cap, "/wirehead.%s", uri + strlen("shm://"));
}

static void remove_all_stores(void) {
    for (int i = 0; i < g_nstores; i++) {
        char n[128];
        seg_name(g_uris[i], n, sizeof n);
        shm_unlink(n); /* async-signal-safe enough: one syscall */
        char pf[160];
        snprintf(pf, sizeof pf, "/dev/shm/wirehead-params.%s", g_uris[i] + strlen("shm://"));
        unlink(pf);
    }
}

static void kid_add(pid_t p) {
    for (int i = 0; i < MAX_KIDS; i++)
        if (!g_kids[i]) {
            g_kids[i] = p;
            return;
        }
}

static void kid_forget(pid_t p) {
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] == p) g_kids[i] = 0;
}

/* Kills and reaps a child this test started. */
static void kid_kill(pid_t p) {
    if (p <= 0) return;
    kill(p, SIGKILL);
    while (waitpid(p, NULL, 0) < 0 && errno == EINTR) {
    }
    kid_forget(p);
}

static void on_fatal(int sig) {
    static const char msg[] = "test_store: watchdog or signal; removing test stores\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] > 0) kill(g_kids[i], SIGKILL);
    remove_all_stores();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void case_run(const char *name, void (*fn)(void)) {
    case_name = name;
    case_ok = true;
    alarm(180); /* a hung test fails the run instead of stalling CI */
    uint64_t t0 = wh_now_mono_ns();
    fn();
    alarm(0);
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] > 0) kid_kill(g_kids[i]);
    if (case_ok)
        n_pass++;
    else
        n_fail++;
    fprintf(stderr, "%-4s %s (%.2f s)\n", case_ok ? "ok" : "FAIL", name,
            (double)(wh_now_mono_ns() - t0) / 1e9);
}

/* ---- helpers ---------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void fill_random(void *p, size_t n) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)rng();
}

static double secs_since(uint64_t t0) { return (double)(wh_now_mono_ns() - t0) / 1e9; }

static wh_schema_t schema_of(int n, const char *const *names) {
    wh_schema_t s;
    wh_err_t e;
    if (!wh_schema_init(&s, n, names, &e)) {
        fprintf(stderr, "schema: %s\n", e.message);
        exit(2);
    }
    return s;
}

static const char *const NAMES_ID_DATA[] = {"id", "data"};

static wh_store_config_t mkcfg(const char *uri, uint32_t swap_cap, uint64_t budget,
                               const wh_schema_t *schema) {
    wh_store_config_t c;
    memset(&c, 0, sizeof c);
    c.uri = uri;
    c.swap_cap = swap_cap;
    c.schema = *schema;
    c.byte_budget = budget;
    c.lease_s = 30.0;
    c.connect_timeout_s = 1.0;
    c.verify_reads = true;
    return c;
}

static void clean_store(const wh_store_config_t *c) {
    wh_err_t e;
    if (!wh_store_clean(c, &e)) fprintf(stderr, "clean %s: %s\n", c->uri, e.message);
}

static bool seg_exists(const char *uri) {
    char p[160];
    snprintf(p, sizeof p, "/dev/shm/wirehead.%s", uri + strlen("shm://"));
    return access(p, F_OK) == 0;
}

static wh_array_t arr0(int dtype, const void *data) {
    wh_array_t a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype;
    a.ndim = 0;
    a.data = data;
    return a;
}

static wh_array_t arr1(int dtype, int64_t n, int64_t stride, const void *data) {
    wh_array_t a = arr0(dtype, data);
    a.ndim = 1;
    a.shape[0] = n;
    a.strides[0] = stride;
    return a;
}

/* Element values of the "data" field for a sample id: the relation the
 * readers check. */
static int64_t data_len(uint64_t id) { return 8 + (int64_t)(id % 500); }
static int32_t data_val(uint64_t id, int64_t k) {
    return (int32_t)(uint32_t)(id * 2654435761u + (uint64_t)k * 40503u);
}

/* A two-field sample {id: int64 0-d, data: int32[data_len(id)]}; data is
 * given reversed with a negative stride when reversed is set. buf must hold
 * data_len(id) int32. */
static void make_id_sample(uint64_t id, int32_t *buf, bool reversed, wh_array_t a[2]) {
    static __thread int64_t idv;
    idv = (int64_t)id;
    int64_t n = data_len(id);
    a[0] = arr0(WH_DT_I64, &idv);
    if (!reversed) {
        for (int64_t k = 0; k < n; k++) buf[k] = data_val(id, k);
        a[1] = arr1(WH_DT_I32, n, 4, buf);
    } else {
        for (int64_t k = 0; k < n; k++) buf[n - 1 - k] = data_val(id, k);
        a[1] = arr1(WH_DT_I32, n, -4, buf + n - 1);
    }
}

/* Read destinations: one buffer per field, with capacities. */
typedef struct {
    void *buf[WH_MAX_FIELDS];
    uint64_t cap[WH_MAX_FIELDS];
    bool refuse;
    int calls;
} dest_t;

static bool dest_cb(void *ctx, const wh_sample_meta_t *m, void **dst, wh_err_t *err) {
    dest_t *d = ctx;
    d->calls++;
    if (d->refuse) return wh_err_set(err, WH_E_INVALID, "destination refused by the test");
    for (int i = 0; i < m->nfields; i++) {
        if (!d->buf[i]) continue;
        if (m->f[i].nbytes > d->cap[i])
            return wh_err_set(err, WH_E_INVALID, "field %d: %llu bytes > buffer %llu", i,
                              (unsigned long long)m->f[i].nbytes, (unsigned long long)d->cap[i]);
        dst[i] = d->buf[i];
    }
    return true;
}

/* Reads an id/data sample; checks the id->data relation and shapes. On
 * success *id_out holds the id. */
typedef struct {
    int64_t id;
    int32_t data[600];
    dest_t d;
} id_reader_t;

static void id_reader_init(id_reader_t *r) {
    memset(r, 0, sizeof *r);
    r->d.buf[0] = &r->id;
    r->d.cap[0] = sizeof r->id;
    r->d.buf[1] = r->data;
    r->d.cap[1] = sizeof r->data;
}

/* Returns true when the sample read back is well-formed; message in why. */
static bool id_sample_ok(const id_reader_t *r, const wh_sample_meta_t *m, char *why, size_t cap) {
    if (m->nfields != 2) return snprintf(why, cap, "nfields %d", m->nfields), false;
    if (m->f[0].dtype != WH_DT_I64 || m->f[0].ndim != 0 || m->f[0].nbytes != 8)
        return snprintf(why, cap, "id field meta dtype %d ndim %d", m->f[0].dtype, m->f[0].ndim),
               false;
    if (r->id < 0) return snprintf(why, cap, "negative id %lld", (long long)r->id), false;
    int64_t n = data_len((uint64_t)r->id);
    if (m->f[1].dtype != WH_DT_I32 || m->f[1].ndim != 1 || m->f[1].shape[0] != n ||
        m->f[1].nbytes != (uint64_t)n * 4)
        return snprintf(why, cap, "id %lld: data meta dtype %d ndim %d shape %lld, want %lld",
                        (long long)r->id, m->f[1].dtype, m->f[1].ndim, (long long)m->f[1].shape[0],
                        (long long)n),
               false;
    for (int64_t k = 0; k < n; k++)
        if (r->data[k] != data_val((uint64_t)r->id, k))
            return snprintf(why, cap, "id %lld: data[%lld] wrong", (long long)r->id, (long long)k),
                   false;
    return true;
}

static bool put_id(wh_store_t *st, uint64_t id, wh_put_status_t *ps, uint64_t *gen, wh_err_t *e) {
    int32_t buf[600];
    wh_array_t a[2];
    make_id_sample(id, buf, id & 1, a);
    return wh_store_put(st, a, 2, 1000, ps, gen, e);
}

/* Puts ids [first, first+n) and checks each is accepted. */
static bool fill_ids(wh_store_t *st, uint64_t first, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        wh_put_status_t ps;
        wh_err_t e;
        if (!put_id(st, first + i, &ps, NULL, &e)) {
            fprintf(stderr, "  put id %llu: %s\n", (unsigned long long)(first + i), e.message);
            return false;
        }
        if (ps != WH_PUT_ACCEPTED) {
            fprintf(stderr, "  put id %llu: status %d\n", (unsigned long long)(first + i), ps);
            return false;
        }
    }
    return true;
}

static bool seal_once(wh_store_t *st, bool *sealed, uint64_t *gen) {
    wh_seal_info_t info;
    wh_err_t e;
    memset(&info, 0, sizeof info);
    if (!wh_store_seal(st, sealed, &info, &e)) {
        fprintf(stderr, "  seal: %s\n", e.message);
        return false;
    }
    if (gen) *gen = info.generation;
    return true;
}

static wh_status_t status_of(wh_store_t *st) {
    wh_status_t s;
    wh_err_t e;
    if (!wh_store_status(st, &s, &e)) {
        fprintf(stderr, "  status: %s\n", e.message);
        memset(&s, 0, sizeof s);
    }
    return s;
}

/* Waits up to timeout_ms for needle on fd (a child's stderr). */
static bool wait_for_line(int fd, const char *needle, int timeout_ms) {
    char buf[8192];
    size_t n = 0;
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint64_t now = wh_now_mono_ns();
        if (now >= deadline) return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false; /* the child closed stderr or died */
        n += (size_t)k;
        buf[n] = 0;
        if (strstr(buf, needle)) return true;
        if (n > sizeof buf / 2) { /* keep the tail: the needle may straddle reads */
            memmove(buf, buf + n - 256, 256);
            n = 256;
        }
    }
}

/* ---- arrays of every dtype and layout ------------------------------- */

#define N_LAYOUTS 11
static const char *const layout_names[N_LAYOUTS] = {"0-d",
                                                    "1-d",
                                                    "4-d contiguous",
                                                    "4-d every-other",
                                                    "4-d transposed",
                                                    "1-d reversed",
                                                    "4-d flipped",
                                                    "2-d neg step-2",
                                                    "zero-size",
                                                    "broadcast stride-0",
                                                    "size-1 dims odd strides"};

/* Builds layout k of dtype dt over base (random bytes, base_len). The
 * view's element [0..0] may sit anywhere in base (negative strides). */
static wh_array_t make_layout(int dt, int k, const unsigned char *base, size_t base_len) {
    int64_t it = (int64_t)wh_dtype_size(dt);
    wh_array_t a = arr0(dt, base);
    /* C-contiguous strides of a (3,4,5,6) parent */
    int64_t P[4] = {120 * it, 30 * it, 6 * it, it};
    switch (k) {
    case 0: a.data = base + 3 * it; break;
    case 1: a = arr1(dt, 7, it, base + it); break;
    case 2:
        a.ndim = 4;
        a.shape[0] = 2, a.shape[1] = 3, a.shape[2] = 4, a.shape[3] = 5;
        a.strides[0] = 60 * it, a.strides[1] = 20 * it, a.strides[2] = 5 * it, a.strides[3] = it;
        break;
    case 3: /* every other element along dims 1 and 3 of the parent */
        a.ndim = 4;
        a.shape[0] = 3, a.shape[1] = 2, a.shape[2] = 5, a.shape[3] = 3;
        a.strides[0] = P[0], a.strides[1] = 2 * P[1], a.strides[2] = P[2], a.strides[3] = 2 * P[3];
        break;
    case 4: /* the (2,3,4,5) array with its axes reversed */
        a.ndim = 4;
        a.shape[0] = 5, a.shape[1] = 4, a.shape[2] = 3, a.shape[3] = 2;
        a.strides[0] = it, a.strides[1] = 5 * it, a.strides[2] = 20 * it, a.strides[3] = 60 * it;
        break;
    case 5: a = arr1(dt, 9, -it, base + 8 * it); break; /* data at the last element */
    case 6: /* parent dims 0 and 2 flipped: element [0,0,0,0] is parent [2,0,4,0] */
        a.ndim = 4;
        a.shape[0] = 3, a.shape[1] = 4, a.shape[2] = 5, a.shape[3] = 6;
        a.strides[0] = -P[0], a.strides[1] = P[1], a.strides[2] = -P[2], a.strides[3] = P[3];
        a.data = base + 2 * P[0] + 4 * P[2];
        break;
    case 7: /* rows and columns reversed, every second column */
        a.ndim = 2;
        a.shape[0] = 3, a.shape[1] = 4;
        a.strides[0] = -8 * it, a.strides[1] = -2 * it;
        a.data = base + 2 * 8 * it + 7 * it;
        break;
    case 8:
        a.ndim = 3;
        a.shape[0] = 3, a.shape[1] = 0, a.shape[2] = 2;
        a.strides[0] = 0, a.strides[1] = 2 * it, a.strides[2] = it;
        break;
    case 9: /* numpy broadcast view: one row repeated */
        a.ndim = 2;
        a.shape[0] = 4, a.shape[1] = 3;
        a.strides[0] = 0, a.strides[1] = it;
        a.data = base + 5 * it;
        break;
    case 10: /* contiguous data whose size-1 dims carry arbitrary strides */
        a.ndim = 3;
        a.shape[0] = 1, a.shape[1] = 6, a.shape[2] = 1;
        a.strides[0] = 12345, a.strides[1] = it, a.strides[2] = -777;
        a.data = base + it;
        break;
    }
    /* the view must stay inside base (guards the test itself) */
    int64_t lo = 0, hi = 0, count = 1;
    for (int d = 0; d < a.ndim; d++) count *= a.shape[d];
    for (int d = 0; d < a.ndim && count; d++) {
        if (a.shape[d] == 0) continue;
        int64_t span = (a.shape[d] - 1) * a.strides[d];
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    int64_t at = (const unsigned char *)a.data - base;
    if (at + lo < 0 || at + hi + it > (int64_t)base_len) {
        fprintf(stderr, "test bug: layout %d outside its base\n", k);
        exit(2);
    }
    return a;
}

/* Reference gather into C order, written independently of wh_sample.c. */
static uint64_t ref_gather(const wh_array_t *a, unsigned char *out) {
    size_t it = wh_dtype_size(a->dtype);
    int64_t n = 1;
    for (int d = 0; d < a->ndim; d++) n *= a->shape[d];
    for (int64_t lin = 0; lin < n; lin++) {
        int64_t rem = lin, off = 0;
        for (int d = a->ndim - 1; d >= 0; d--) {
            off += (rem % a->shape[d]) * a->strides[d];
            rem /= a->shape[d];
        }
        memcpy(out + (size_t)lin * it, (const unsigned char *)a->data + off, it);
    }
    return (uint64_t)n * it;
}

static bool meta_matches(const wh_field_meta_t *f, const wh_array_t *a) {
    if (f->dtype != a->dtype || f->ndim != a->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (f->shape[d] != a->shape[d]) return false;
    return true;
}

/* ---- sample format ---------------------------------------------------- */

static void *xaligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Every dtype x layout, as field "a" next to a fixed int64 field "b":
 * encode, decode the header, copy both fields out with checksum. */
static void t_sample_roundtrip(void) {
    static const char *const names[] = {"a", "b"};
    wh_schema_t s = schema_of(2, names);
    size_t base_len = 4096 * 16;
    unsigned char *base = xaligned(base_len);
    unsigned char *want = xaligned(base_len), *got = xaligned(base_len);
    int64_t b_vals[5] = {-1, INT64_MIN, INT64_MAX, 0, 42};
    int cases = 0;
    for (int dt = 1; dt < WH_DT_MAX_; dt++) {
        for (int k = 0; k < N_LAYOUTS; k++) {
            fill_random(base, base_len);
            wh_array_t a[2] = {make_layout(dt, k, base, base_len), arr1(WH_DT_I64, 5, 8, b_vals)};
            wh_sample_meta_t meta, dm;
            wh_err_t e;
            bool ok = wh_sample_plan(&s, a, 2, &meta, &e);
            CHECK(ok, "%s %s: plan: %s", wh_dtype_name(dt), layout_names[k], e.message);
            if (!ok) continue;
            unsigned char *enc = xaligned(meta.total_size);
            memset(enc, 0xAB, meta.total_size);
            ok = wh_sample_encode(enc, meta.total_size, &s, a, &meta, false, &e);
            CHECK(ok, "%s %s: encode: %s", wh_dtype_name(dt), layout_names[k], e.message);
            ok = ok && wh_sample_decode_meta(enc, meta.total_size, &s, 0, 0, &dm, &e);
            CHECK(ok, "%s %s: decode: %s", wh_dtype_name(dt), layout_names[k], e.message);
            if (ok) {
                CHECK(dm.total_size == meta.total_size && dm.nfields == 2, "%s %s: sizes",
                      wh_dtype_name(dt), layout_names[k]);
                CHECK(meta_matches(&dm.f[0], &a[0]) && meta_matches(&dm.f[1], &a[1]),
                      "%s %s: dtype/shape not kept", wh_dtype_name(dt), layout_names[k]);
                CHECK(dm.f[0].offset % WH_ALIGN == 0 && dm.f[1].offset % WH_ALIGN == 0,
                      "fields not %d-byte aligned", WH_ALIGN);
                uint64_t nb = ref_gather(&a[0], want);
                CHECK(dm.f[0].nbytes == nb, "%s %s: nbytes %llu want %llu", wh_dtype_name(dt),
                      layout_names[k], (unsigned long long)dm.f[0].nbytes, (unsigned long long)nb);
                memset(got, 0x5A, base_len);
                ok = wh_sample_copy_field(enc, &s, &dm, 0, got, true, &e);
                CHECK(ok, "%s %s: copy: %s", wh_dtype_name(dt), layout_names[k], e.message);
                CHECK(memcmp(got, want, nb) == 0, "%s %s: bytes differ", wh_dtype_name(dt),
                      layout_names[k]);
                int64_t bo[5];
                ok = wh_sample_copy_field(enc, &s, &dm, 1, bo, true, &e);
                CHECK(ok && memcmp(bo, b_vals, sizeof bo) == 0, "%s %s: second field differs",
                      wh_dtype_name(dt), layout_names[k]);
                CHECK(wh_sample_verify(&s, &dm, 0, enc + dm.f[0].offset, &e), "verify: %s",
                      e.message);
                /* encoding the same arrays again gives the same bytes
                 * (padding zeroed, deterministic header) */
                unsigned char *enc2 = xaligned(meta.total_size);
                memset(enc2, 0x11, meta.total_size);
                wh_sample_meta_t m2;
                wh_sample_plan(&s, a, 2, &m2, &e);
                wh_sample_encode(enc2, m2.total_size, &s, a, &m2, false, &e);
                CHECK(memcmp(enc, enc2, meta.total_size) == 0, "%s %s: encoding not deterministic",
                      wh_dtype_name(dt), layout_names[k]);
                free(enc2);
            }
            free(enc);
            cases++;
        }
    }
    CHECK(cases == (WH_DT_MAX_ - 1) * N_LAYOUTS, "ran %d cases", cases);
    free(base);
    free(want);
    free(got);
}

static void t_sample_plan_rejects(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    int32_t buf[600];
    wh_array_t a[2];
    wh_sample_meta_t m;
    wh_err_t e;
    make_id_sample(3, buf, false, a);
    CHECK(wh_sample_plan(&s, a, 2, &m, &e), "valid sample: %s", e.message);
    CHECK(!wh_sample_plan(&s, a, 1, &m, &e) && e.code == WH_E_INVALID, "1 field of 2");
    CHECK(!wh_sample_plan(&s, a, 3, &m, &e) && e.code == WH_E_INVALID, "3 fields of 2");
    wh_array_t b[2] = {a[0], a[1]};
    b[1].dtype = 0;
    CHECK(!wh_sample_plan(&s, b, 2, &m, &e) && e.code == WH_E_INVALID && strstr(e.message, "data"),
          "dtype 0 (message should name the field): %s", e.message);
    b[1].dtype = WH_DT_MAX_;
    CHECK(!wh_sample_plan(&s, b, 2, &m, &e) && e.code == WH_E_INVALID, "dtype past the end");
    b[1] = a[1];
    b[1].ndim = WH_MAX_NDIM + 1;
    CHECK(!wh_sample_plan(&s, b, 2, &m, &e) && e.code == WH_E_INVALID, "too many dims");
    b[1] = a[1];
    b[1].shape[0] = -1;
    CHECK(!wh_sample_plan(&s, b, 2, &m, &e) && e.code == WH_E_INVALID, "negative shape");
    b[1] = a[1];
    b[1].ndim = 3;
    b[1].shape[0] = b[1].shape[1] = b[1].shape[2] = (int64_t)1 << 30;
    CHECK(!wh_sample_plan(&s, b, 2, &m, &e) && e.code == WH_E_INVALID, "size overflow");
    b[1] = a[1];
    b[1].data = NULL;
    CHECK(!wh_sample_plan(&s, b, 2, &m, &e) && e.code == WH_E_INVALID, "no data");
    b[0] = arr1(WH_DT_I64, 0, 8, NULL); /* empty array needs no data */
    b[1] = a[1];
    CHECK(wh_sample_plan(&s, b, 2, &m, &e), "empty field: %s", e.message);
    /* schema rules */
    wh_schema_t t;
    static const char *const dup[] = {"x", "x"};
    static const char *const empty[] = {""};
    CHECK(!wh_schema_init(&t, 2, dup, &e) && e.code == WH_E_INVALID, "duplicate names");
    CHECK(!wh_schema_init(&t, 1, empty, &e) && e.code == WH_E_INVALID, "empty name");
    CHECK(!wh_schema_init(&t, 0, dup, &e) && e.code == WH_E_INVALID, "no fields");
    static const char *const ab[] = {"a", "b"}, *const ba[] = {"b", "a"};
    wh_schema_t s1 = schema_of(2, ab), s2 = schema_of(2, ba);
    CHECK(s1.hash != s2.hash, "field order must change the schema hash");
}

/* Header offsets from wh_sample.h's layout: header 64 bytes (magic u32,
 * version u16, nfields u16, schema hash, total size, header size, header
 * checksum), then 96-byte descriptors (dtype u8, ndim u8, shape[8] at 8,
 * offset at 72, nbytes at 80, checksum at 88). */
enum {
    H_MAGIC = 0,
    H_VER = 4,
    H_NF = 6,
    H_SCHEMA = 8,
    H_TOTAL = 16,
    H_HSIZE = 24,
    H_HSUM = 32
};
enum {
    D_DTYPE = 0,
    D_NDIM = 1,
    D_SHAPE = 8,
    D_OFF = 72,
    D_NBYTES = 80,
    D_SUM = 88
};

static uint64_t get64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Recomputes the header checksum after an edit, so the semantic checks
 * behind it are reached. */
static void rehash(unsigned char *b) {
    uint64_t hs = get64(b + H_HSIZE);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, b, 32);
    XXH3_64bits_update(&st, b + 40, hs - 40); /* all but the checksum field */
    put64(b + H_HSUM, XXH3_64bits_digest(&st));
}

#define N_EDITS 20
static const char *const edit_names[N_EDITS] = {"dtype code 0",
                                                "dtype code 99",
                                                "dtype changed size",
                                                "ndim 9",
                                                "ndim 0 for a 1-d field",
                                                "shape +1",
                                                "shape beyond ndim",
                                                "shape overflow",
                                                "shape > INT64_MAX",
                                                "nbytes +4",
                                                "nbytes huge",
                                                "offset +64",
                                                "offset -64",
                                                "offset near 2^64",
                                                "first offset 0",
                                                "total size +64",
                                                "total size -64",
                                                "total size 0",
                                                "header size +64",
                                                "magic"};

/* Edit k of a header: d0, d1 are the two field descriptors. */
static void apply_edit(int k, unsigned char *b, unsigned char *d0, unsigned char *d1) {
    switch (k) {
    case 0: d1[D_DTYPE] = 0; break;
    case 1: d1[D_DTYPE] = 99; break;
    case 2: d1[D_DTYPE] = WH_DT_I64; break;
    case 3: d1[D_NDIM] = 9; break;
    case 4: d1[D_NDIM] = 0; break;
    case 5: put64(d1 + D_SHAPE, get64(d1 + D_SHAPE) + 1); break;
    case 6: put64(d1 + D_SHAPE + 8, 1); break;
    case 7:
        d1[D_NDIM] = 2;
        put64(d1 + D_SHAPE, 1ull << 62);
        put64(d1 + D_SHAPE + 8, 1ull << 62);
        break;
    case 8: put64(d1 + D_SHAPE, 1ull << 63); break;
    case 9: put64(d1 + D_NBYTES, get64(d1 + D_NBYTES) + 4); break;
    case 10: put64(d1 + D_NBYTES, UINT64_MAX); break;
    case 11: put64(d1 + D_OFF, get64(d1 + D_OFF) + 64); break;
    case 12: put64(d1 + D_OFF, get64(d1 + D_OFF) - 64); break;
    case 13: put64(d1 + D_OFF, UINT64_MAX - 8); break;
    case 14: put64(d0 + D_OFF, 0); break;
    case 15: put64(b + H_TOTAL, get64(b + H_TOTAL) + 64); break;
    case 16: put64(b + H_TOTAL, get64(b + H_TOTAL) - 64); break;
    case 17: put64(b + H_TOTAL, 0); break;
    case 18: put64(b + H_HSIZE, get64(b + H_HSIZE) + 64); break;
    case 19: b[H_MAGIC + 3] ^= 0x40; break;
    }
}

static void t_sample_corrupt(void) {
    enum {
        G = 41,
        P = 3
    };
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    static const char *const other_names[] = {"id", "label"};
    wh_schema_t other = schema_of(2, other_names);
    int32_t buf[600];
    wh_array_t a[2];
    make_id_sample(77, buf, false, a);
    wh_sample_meta_t m, dm;
    wh_err_t e;
    wh_sample_plan(&s, a, 2, &m, &e);
    size_t n = m.total_size;
    unsigned char *good = xaligned(n), *b = xaligned(n);
    CHECK(wh_sample_encode(good, n, &s, a, &m, false, &e), "encode: %s", e.message);
    wh_sample_set_place(good, &m, G, P);
    CHECK(wh_sample_decode_meta(good, n, &s, G, P, &dm, &e) && dm.gen == G && dm.pos == P,
          "decode: %s", e.message);
    /* an index entry pointing at another sample: its recorded place differs */
    CHECK(!wh_sample_decode_meta(good, n, &s, G, P + 1, &dm, &e) && e.code == WH_E_CORRUPT &&
              strstr(e.message, "position 3"),
          "another position: code %d (%s)", e.code, e.message);
    CHECK(!wh_sample_decode_meta(good, n, &s, G + 1, P, &dm, &e) && e.code == WH_E_CORRUPT,
          "another generation: code %d", e.code);
    uint64_t hs = m.header_size;
    unsigned char *d0 = b + 64, *d1 = b + 64 + 96;

    /* single bit flips anywhere in the header: all damage, none a schema
     * change (a flipped version or schema hash must not end an epoch) */
    int flips = 0, bad = 0;
    for (uint64_t off = 0; off < hs; off++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(b, good, n);
            b[off] ^= (unsigned char)(1u << bit);
            bool ok = wh_sample_decode_meta(b, n, &s, G, P, &dm, &e);
            flips++;
            wh_code_t want = WH_E_CORRUPT;
            if (ok || e.code != want) {
                if (bad++ < 5)
                    CHECK(false, "flip byte %llu bit %d: ok=%d code %d want %d (%s)",
                          (unsigned long long)off, bit, ok, ok ? 0 : e.code, want,
                          ok ? "" : e.message);
            }
        }
    }
    CHECK(bad == 0, "%d of %d header bit flips not rejected as they should be", bad, flips);

    /* edits that keep the header checksum valid reach the semantic checks */
    for (int k = 0; k < N_EDITS; k++) {
        memcpy(b, good, n);
        apply_edit(k, b, d0, d1);
        if (get64(b + H_HSIZE) <= n) rehash(b);
        bool ok = wh_sample_decode_meta(b, n, &s, G, P, &dm, &e);
        CHECK(!ok && e.code == WH_E_CORRUPT, "%s: ok=%d code %d (%s)", edit_names[k], ok,
              ok ? 0 : e.code, ok ? "" : e.message);
    }
    /* another format version or schema is a schema error, not corruption */
    memcpy(b, good, n);
    b[H_VER] = WH_FORMAT_VERSION + 1;
    rehash(b);
    CHECK(!wh_sample_decode_meta(b, n, &s, G, P, &dm, &e) && e.code == WH_E_SCHEMA,
          "version: code %d", e.code);
    /* a version-1 sample (its checksum left bytes 40..63 out) is refused by name */
    memcpy(b, good, n);
    b[H_VER] = 1;
    {
        XXH3_state_t st;
        XXH3_64bits_reset(&st);
        XXH3_64bits_update(&st, b, 32);
        XXH3_64bits_update(&st, b + 64, hs - 64);
        put64(b + H_HSUM, XXH3_64bits_digest(&st));
    }
    CHECK(!wh_sample_decode_meta(b, n, &s, G, P, &dm, &e) && e.code == WH_E_SCHEMA &&
              strstr(e.message, "version 1"),
          "version 1: code %d (%s)", e.code, e.message);
    CHECK(!wh_sample_decode_meta(good, n, &other, G, P, &dm, &e) && e.code == WH_E_SCHEMA,
          "other schema: code %d", e.code);
    /* truncated buffers */
    CHECK(!wh_sample_decode_meta(good, 10, &s, G, P, &dm, &e) && e.code == WH_E_CORRUPT,
          "10 bytes");
    CHECK(!wh_sample_decode_meta(good, hs - 1, &s, G, P, &dm, &e) && e.code == WH_E_CORRUPT,
          "header cut short");
    CHECK(wh_sample_decode_meta(good, hs, &s, G, P, &dm, &e), "header only must parse: %s",
          e.message);

    /* a flipped data byte: the header is fine, the checksum catches it */
    for (int f = 0; f < 2; f++) {
        memcpy(b, good, n);
        b[m.f[f].offset + m.f[f].nbytes / 2] ^= 0x01;
        CHECK(wh_sample_decode_meta(b, n, &s, G, P, &dm, &e),
              "data flip must not break the header");
        int32_t out[600];
        bool ok = wh_sample_copy_field(b, &s, &dm, f, out, true, &e);
        CHECK(!ok && e.code == WH_E_CORRUPT && strstr(e.message, s.names[f]),
              "field %d: checksum not caught or message does not name the field (%s)", f,
              ok ? "ok" : e.message);
        CHECK(wh_sample_copy_field(b, &s, &dm, 1 - f, out, true, &e),
              "the other field must still read: %s", e.message);
        CHECK(wh_sample_copy_field(b, &s, &dm, f, out, false, &e), "verify off copies anyway");
        CHECK(!wh_sample_verify(&s, &dm, f, b + dm.f[f].offset, &e) && e.code == WH_E_CORRUPT,
              "wh_sample_verify");
    }
    free(good);
    free(b);
}

/* ---- store: basic protocol --------------------------------------------- */

static void t_store_basic(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 4, 1 << 20, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    id_reader_t r;
    id_reader_init(&r);
    wh_sample_meta_t m;
    REQUIRE(st, "open: %s", e.message);
    /* segment: mode 0600 and its bytes really reserved (fallocate) */
    char p[160];
    snprintf(p, sizeof p, "/dev/shm/wirehead.%s", c.uri + 6);
    struct stat sb;
    CHECK(stat(p, &sb) == 0, "segment file %s missing", p);
    CHECK((sb.st_mode & 0777) == 0600, "segment mode %o, want 600", sb.st_mode & 0777);
    CHECK((uint64_t)sb.st_blocks * 512 >= (uint64_t)sb.st_size && sb.st_size >= 3 << 20,
          "segment %lld bytes but only %lld allocated", (long long)sb.st_size,
          (long long)sb.st_blocks * 512);

    uint64_t g = 99;
    CHECK(wh_store_current(st, &g, &e) && g == 0, "current before any seal: %llu",
          (unsigned long long)g);
    CHECK(!wh_store_read(st, 0, 0, dest_cb, &r.d, &m, &e) && e.code == WH_E_NOTFOUND,
          "read gen 0: code %d", e.code);
    wh_status_t s0 = status_of(st);
    CHECK(s0.read_gen == 0 && s0.write_gen > 0 && s0.write_fill == 0 && s0.swap_cap == 4,
          "initial status");
    bool lead = false, sealed = true;
    CHECK(wh_store_lead(st, &lead, &e) && lead, "lead: %s", e.message);
    CHECK(seal_once(st, &sealed, NULL) && !sealed, "sealed an empty generation");

    uint64_t wg = s0.write_gen, pg = 0;
    for (uint64_t id = 0; id < 3; id++) {
        wh_put_status_t ps;
        CHECK(put_id(st, id, &ps, &pg, &e) && ps == WH_PUT_ACCEPTED && pg == wg,
              "put %llu: status %d gen %llu", (unsigned long long)id, ps, (unsigned long long)pg);
    }
    CHECK(seal_once(st, &sealed, NULL) && !sealed, "sealed with 3 of 4");
    CHECK(!wh_store_read(st, wg, 0, dest_cb, &r.d, &m, &e) && e.code == WH_E_NOTFOUND,
          "the write generation is not readable");
    wh_put_status_t ps;
    CHECK(put_id(st, 3, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "4th put");
    for (uint64_t id = 4; id < 6; id++)
        CHECK(put_id(st, id, &ps, &pg, &e) && ps == WH_PUT_DISCARDED && pg == wg,
              "surplus put %llu: status %d", (unsigned long long)id, ps);
    wh_status_t s1 = status_of(st);
    CHECK(s1.write_fill == 4 && s1.generated == 4 && s1.discarded == 2 && s1.read_gen == 0,
          "status fill %u generated %llu discarded %llu", s1.write_fill,
          (unsigned long long)s1.generated, (unsigned long long)s1.discarded);
    wh_seal_info_t info;
    CHECK(wh_store_seal(st, &sealed, &info, &e) && sealed, "seal a full generation: %s", e.message);
    CHECK(info.generation == wg && info.generated == 4 && info.discarded == 2,
          "seal info gen %llu generated %llu", (unsigned long long)info.generation,
          (unsigned long long)info.generated);
    CHECK(wh_store_current(st, &g, &e) && g == wg, "current after seal");
    /* exactly the first 4 samples, in commit order */
    for (uint32_t pos = 0; pos < 4; pos++) {
        char why[200] = "";
        bool ok = wh_store_read(st, wg, pos, dest_cb, &r.d, &m, &e);
        CHECK(ok && id_sample_ok(&r, &m, why, sizeof why) && r.id == pos,
              "read pos %u: %s %s id %lld", pos, ok ? "" : e.message, why, (long long)r.id);
    }
    CHECK(!wh_store_read(st, wg, 4, dest_cb, &r.d, &m, &e) && e.code == WH_E_INVALID,
          "position past SWAP_CAP: code %d", e.code);
    CHECK(!wh_store_read(st, wg + 1, 0, dest_cb, &r.d, &m, &e) && e.code == WH_E_NOTFOUND,
          "unsealed generation: code %d", e.code);
    /* a read with no callback validates only; a NULL destination skips */
    CHECK(wh_store_read(st, wg, 1, NULL, NULL, &m, &e) && m.nfields == 2, "read without dest");
    {
        dest_t d = r.d;
        d.buf[1] = NULL;
        r.id = -5;
        CHECK(wh_store_read(st, wg, 2, dest_cb, &d, &m, &e) && r.id == 2, "skip a field");
        d.refuse = true;
        CHECK(!wh_store_read(st, wg, 2, dest_cb, &d, &m, &e) && e.code == WH_E_INVALID &&
                  strstr(e.message, "refused"),
              "a refusing callback's error is returned: %s", e.message);
        dest_t small = r.d;
        small.cap[1] = 8;
        CHECK(!wh_store_read(st, wg, 2, dest_cb, &small, &m, &e), "small buffer refused");
    }
    /* the next generation opened empty; generation ids increase */
    s1 = status_of(st);
    CHECK(s1.write_gen == wg + 1 && s1.write_fill == 0 && s1.seals == 1 && s1.nhistory == 1 &&
              s1.history[0].generation == wg,
          "status after seal");
    CHECK(s1.leader_pid == (uint64_t)getpid() && s1.lease_left_s > 0, "leader in status");
    CHECK(fill_ids(st, 10, 4), "fill the next generation");
    uint64_t g2 = 0;
    CHECK(seal_once(st, &sealed, &g2) && sealed && g2 == wg + 1, "second seal gen %llu",
          (unsigned long long)g2);
    CHECK(wh_store_read(st, wg, 0, dest_cb, &r.d, &m, &e) && r.id == 0,
          "previous generation still readable: %s", e.message);
    /* a second handle sees the same state */
    wh_store_t *st2 = wh_store_open(&c, &e);
    CHECK(st2, "second handle: %s", e.message);
    if (st2) {
        CHECK(wh_store_current(st2, &g, &e) && g == g2, "second handle current");
        CHECK(wh_store_read(st2, g2, 3, dest_cb, &r.d, &m, &e) && r.id == 13, "second handle read");
        wh_store_destroy(st2);
    }
    wh_store_resign(st, &e);
out:
    wh_store_destroy(st);
    clean_store(&c);
    CHECK(!seg_exists(c.uri), "clean left the segment");
    CHECK(wh_store_clean(&c, &e), "clean of a missing store succeeds: %s", e.message);
}

/* Every dtype and layout through the store, bit for bit. */
static void t_store_dtypes(void) {
    static const char *const names[] = {"x"};
    wh_schema_t s = schema_of(1, names);
    uint32_t n = (WH_DT_MAX_ - 1) * N_LAYOUTS;
    wh_store_config_t c = mkcfg(new_uri(), n, 4 << 20, &s);
    wh_err_t e;
    size_t base_len = 4096 * 16;
    unsigned char *bases = xaligned(base_len * n);
    unsigned char *want = xaligned(base_len), *got = xaligned(base_len);
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    bool lead, sealed;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    fill_random(bases, base_len * n);
    for (uint32_t i = 0; i < n; i++) {
        wh_array_t a = make_layout(1 + (int)(i / N_LAYOUTS), (int)(i % N_LAYOUTS),
                                   bases + i * base_len, base_len);
        wh_put_status_t ps;
        CHECK(wh_store_put(st, &a, 1, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "put %u: %s",
              i, e.message);
    }
    uint64_t g = 0;
    REQUIRE(seal_once(st, &sealed, &g) && sealed, "seal");
    for (uint32_t i = 0; i < n; i++) {
        int dt = 1 + (int)(i / N_LAYOUTS), k = (int)(i % N_LAYOUTS);
        wh_array_t a = make_layout(dt, k, bases + i * base_len, base_len);
        dest_t d = {.buf = {got}, .cap = {base_len}};
        wh_sample_meta_t m;
        memset(got, 0xEE, base_len);
        bool ok = wh_store_read(st, g, i, dest_cb, &d, &m, &e);
        CHECK(ok, "%s %s: read: %s", wh_dtype_name(dt), layout_names[k], e.message);
        if (!ok) continue;
        uint64_t nb = ref_gather(&a, want);
        CHECK(meta_matches(&m.f[0], &a) && m.f[0].nbytes == nb, "%s %s: dtype/shape",
              wh_dtype_name(dt), layout_names[k]);
        CHECK(memcmp(got, want, nb) == 0, "%s %s: bytes differ", wh_dtype_name(dt),
              layout_names[k]);
    }
out:
    wh_store_destroy(st);
    clean_store(&c);
    free(bases);
    free(want);
    free(got);
}

/* A flipped byte inside a stored sample: that read fails with
 * WH_E_CORRUPT, the others still read. */
static void t_store_corrupt_bytes(void) {
    static const char *const names[] = {"x"};
    wh_schema_t s = schema_of(1, names);
    wh_store_config_t c = mkcfg(new_uri(), 3, 1 << 20, &s);
    wh_err_t e;
    unsigned char *map = NULL;
    size_t map_len = 0;
    uint64_t vals[3][512];
    wh_store_t *st = wh_store_open(&c, &e), *raw = NULL;
    REQUIRE(st, "open: %s", e.message);
    bool lead, sealed;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 512; k++) vals[i][k] = rng();
        vals[i][100] = 0x5eed5eed00000000ull + (uint64_t)i; /* marker to find it */
        wh_array_t a = arr1(WH_DT_U64, 512, 8, vals[i]);
        wh_put_status_t ps;
        CHECK(wh_store_put(st, &a, 1, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "put");
    }
    uint64_t g;
    REQUIRE(seal_once(st, &sealed, &g) && sealed, "seal");
    char sn[128];
    seg_name(c.uri, sn, sizeof sn);
    int fd = shm_open(sn, O_RDWR, 0);
    REQUIRE(fd >= 0, "shm_open: %s", strerror(errno));
    struct stat sb;
    fstat(fd, &sb);
    map_len = (size_t)sb.st_size;
    map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(map != MAP_FAILED, "mmap");
    uint64_t marker = 0x5eed5eed00000001ull;
    unsigned char *hit = memmem(map, map_len, &marker, 8);
    REQUIRE(hit, "sample 1's bytes not found in the segment");
    hit[3] ^= 0x10;
    uint64_t out[512];
    dest_t d = {.buf = {out}, .cap = {sizeof out}};
    CHECK(!wh_store_read(st, g, 1, dest_cb, &d, NULL, &e) && e.code == WH_E_CORRUPT,
          "corrupt sample: code %d (%s)", e.code, e.message);
    CHECK(strstr(e.message, "position 1") && strstr(e.message, "'x'"),
          "message should name the position and field: %s", e.message);
    for (int i = 0; i < 3; i += 2)
        CHECK(wh_store_read(st, g, (uint32_t)i, dest_cb, &d, NULL, &e) &&
                  memcmp(out, vals[i], sizeof out) == 0,
              "intact sample %d: %s", i, e.message);
    /* with verification off the bytes are handed over as stored */
    wh_store_config_t c2 = c;
    c2.verify_reads = false;
    raw = wh_store_open(&c2, &e);
    CHECK(raw && wh_store_read(raw, g, 1, dest_cb, &d, NULL, &e) && out[100] != vals[1][100],
          "unverified read");
    /* a corrupted header is caught even with verification off: sample 1
     * starts 192 header bytes + 100 elements before the marker */
    hit[3] ^= 0x10;
    unsigned char *start = hit - 100 * 8 - 192;
    uint32_t magic;
    memcpy(&magic, start, 4);
    REQUIRE(magic == WH_SAMPLE_MAGIC, "sample start not where expected");
    start[H_TOTAL] ^= 0x40;
    CHECK(raw && !wh_store_read(raw, g, 1, dest_cb, &d, NULL, &e) && e.code == WH_E_CORRUPT,
          "corrupt header with verify off: code %d (%s)", e.code, e.message);
    start[H_TOTAL] ^= 0x40;
    CHECK(raw && wh_store_read(raw, g, 1, dest_cb, &d, NULL, &e) &&
              memcmp(out, vals[1], sizeof out) == 0,
          "restored sample reads again: %s", e.message);
out:
    if (map && map != MAP_FAILED) munmap(map, map_len);
    wh_store_destroy(raw);
    wh_store_destroy(st);
    clean_store(&c);
}

/* Reading a reclaimed generation: WH_E_GONE, the newer two still read. */
/* A store-backed view pins its generation: it stays exact across many
 * seals, a second generation's view is refused (one per process), and it
 * outlives its handle; its release frees everything (leak check). */
static bool view_ok(wh_buf_t *v, const wh_sample_meta_t *m, int64_t want_id) {
    const char *p = v->data;
    int64_t id;
    memcpy(&id, p + m->f[0].offset, sizeof id);
    if (id != want_id) return false;
    const int32_t *d = (const int32_t *)(p + m->f[1].offset);
    for (int64_t k = 0; k < m->f[1].shape[0]; k++)
        if (d[k] != data_val((uint64_t)id, k)) return false;
    return m->f[1].shape[0] == data_len((uint64_t)id);
}

static void t_store_views(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    bool lead, sealed;
    uint64_t g = 0, g0 = 0;
    wh_buf_t *v[2] = {NULL, NULL}, *other = NULL;
    wh_sample_meta_t m[2], mo;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    REQUIRE(fill_ids(st, 10, 2) && seal_once(st, &sealed, &g0) && sealed, "first seal");
    for (uint32_t pos = 0; pos < 2; pos++)
        REQUIRE(wh_store_view(st, g0, pos, &v[pos], &m[pos], &e), "view %u: %s", pos, e.message);
    for (int k = 1; k <= 12; k++) {
        REQUIRE(fill_ids(st, 100 * (uint64_t)k, 2) && seal_once(st, &sealed, &g) && sealed,
                "seal %d with views held", k);
        CHECK(view_ok(v[0], &m[0], 10) && view_ok(v[1], &m[1], 11), "views after seal %d", k);
    }
    CHECK(!wh_store_view(st, g, 0, &other, &mo, &e) && e.code == WH_E_PINNED,
          "a second generation's view: code %d (%s)", e.code, e.message);
    wh_store_destroy(st);
    st = NULL;
    CHECK(view_ok(v[0], &m[0], 10) && view_ok(v[1], &m[1], 11), "views after the handle closed");
out:
    wh_buf_unref(v[0]);
    wh_buf_unref(v[1]);
    wh_store_destroy(st);
    clean_store(&c);
}

/* The scheme table and the operation table: what each scheme's backend can
 * do comes from its table, and a backend without an optional op (here the
 * shm backend's table less them, under another name) is refused by the
 * dispatch with WH_E_INVALID naming it, while what it has still works. */
static void t_backend_table(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_store_t *st = NULL;
    const wh_store_ops_t *real = NULL;
    wh_backend_info_t b;
    wh_err_t e;
    const struct {
        const char *uri, *scheme, *backend, *name;
        unsigned caps;
    } want[] = {
        {"shm://x.y", "shm", "shm", "x.y",
         WH_CAP_VIEWS | WH_CAP_PINS | WH_CAP_MAPPABLE | WH_CAP_PARAMS_FILE | WH_CAP_RELAY_TARGET |
             WH_CAP_SPEC},
        {"mongodb://h:1/db", "mongodb", "mongodb", NULL, WH_CAP_RELAY_SOURCE | WH_CAP_SPEC},
        {"mongodb+srv://u:p@h/db", "mongodb+srv", "mongodb", NULL,
         WH_CAP_RELAY_SOURCE | WH_CAP_SPEC},
    };
    for (size_t i = 0; i < WH_ARRAY_LEN(want); i++) {
        REQUIRE(wh_store_backend_of(want[i].uri, &b, &e), "%s: %s", want[i].uri, e.message);
        CHECK(!strcmp(b.scheme, want[i].scheme) && !strcmp(b.backend, want[i].backend) &&
                  b.caps == want[i].caps &&
                  (want[i].name ? b.name && !strcmp(b.name, want[i].name) : !b.name),
              "%s: %s %s %#x %s", want[i].uri, b.scheme, b.backend, b.caps, b.name);
    }
    CHECK(!wh_store_backend_of("mongo://h", &b, &e) && e.code == WH_E_INVALID &&
              strstr(e.message, "shm://, mongodb:// or mongodb+srv://"),
          "unknown scheme: %s", e.message);

    st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    real = st->ops;
    wh_store_ops_t bare = *real;
    bare.name = "bare";
    bare.flags = 0;
    bare.view = NULL;
    bare.read_held = NULL;
    bare.set_dma_views = NULL;
    bare.view_map = NULL;
    bare.read_encoded = NULL;
    bare.mirror_begin = NULL;
    bare.spec_claim = NULL;
    st->ops = &bare;
    CHECK(wh_store_caps(st) == 0, "caps of a table without optional ops: %#x", wh_store_caps(st));
    bool lead, sealed;
    uint64_t g = 0;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead && fill_ids(st, 7, 2) &&
                seal_once(st, &sealed, &g) && sealed,
            "the ops it has: %s", e.message);
    wh_buf_t *v = NULL;
    wh_sample_meta_t m;
    CHECK(!wh_store_view(st, g, 0, &v, &m, &e) && e.code == WH_E_INVALID &&
              strstr(e.message, "the bare backend has none") && strstr(e.message, "shm://"),
          "view: %d %s", e.code, e.message);
    void *dst = NULL;
    CHECK(!wh_store_mirror_begin(st, g + 1, 0, &e) && e.code == WH_E_INVALID &&
              !wh_store_mirror_reserve(st, g + 1, 0, 8, &dst, &e) && e.code == WH_E_INVALID &&
              strstr(e.message, "bare"),
          "mirror: %d %s", e.code, e.message);
    CHECK(!wh_store_read_encoded(st, g, 0, NULL, NULL, NULL, &e) && e.code == WH_E_INVALID &&
              strstr(e.message, "mongodb://") && strstr(e.message, "bare"),
          "encoded read: %d %s", e.code, e.message);
    wh_store_set_dma_views(st, true); /* no views: nothing to hold */
    id_reader_t r;
    id_reader_init(&r);
    wh_read_at_t at = {.gen = g, .pos = 1};
    wh_sample_meta_t rm;
    char why[128] = "";
    CHECK(wh_store_read_sample(st, &at, 1.0, NULL, dest_cb, &r.d, &rm, &e) && at.gen == g &&
              id_sample_ok(&r, &rm, why, sizeof why),
          "read policy without pins: %s %s", e.message, why);
out:
    if (st && real) st->ops = real;
    wh_store_destroy(st);
    clean_store(&c);
}

static void t_store_gone(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_err_t e;
    id_reader_t r;
    id_reader_init(&r);
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    bool lead, sealed;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    uint64_t gens[5] = {0};
    for (int i = 0; i < 5; i++) {
        REQUIRE(fill_ids(st, 100 * (uint64_t)i, 2), "fill %d", i);
        REQUIRE(seal_once(st, &sealed, &gens[i]) && sealed, "seal %d", i);
        if (i) CHECK(gens[i] == gens[i - 1] + 1, "generation ids consecutive");
        if (i == 1)
            CHECK(wh_store_read(st, gens[0], 1, dest_cb, &r.d, NULL, &e) && r.id == 1,
                  "the retiring generation reads: %s", e.message);
    }
    wh_sample_meta_t m;
    CHECK(!wh_store_read(st, gens[0], 0, dest_cb, &r.d, &m, &e) && e.code == WH_E_GONE,
          "oldest after 4 more seals (4 areas): code %d (%s)", e.code, e.message);
    CHECK(!wh_store_read(st, gens[1], 0, dest_cb, &r.d, &m, &e) && e.code == WH_E_GONE,
          "second oldest: code %d", e.code);
    for (int i = 2; i < 5; i++)
        for (uint32_t pos = 0; pos < 2; pos++)
            CHECK(wh_store_read(st, gens[i], pos, dest_cb, &r.d, &m, &e) &&
                      r.id == 100 * i + (int64_t)pos,
                  "gen %d pos %u: %s", i, pos, e.message);
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* A reader loses the race with reclamation in the middle of a read: its
 * destination callback (called between validation and the copy) seals
 * enough generations (4 areas) through another handle and overwrites the slot being
 * read. The read must say WH_E_GONE, never hand out the new bytes. */
typedef struct {
    wh_store_t *mgr;
    uint64_t next_id;
    bool fired;
    bool ok;
    id_reader_t *r;
} race_ctx_t;

static bool race_dest(void *ctx, const wh_sample_meta_t *m, void **dst, wh_err_t *err) {
    race_ctx_t *x = ctx;
    if (!x->fired) {
        x->fired = true;
        x->ok = true;
        for (int k = 0; k < 3 && x->ok; k++) {
            bool sealed = false;
            x->ok = fill_ids(x->mgr, x->next_id, 2) && seal_once(x->mgr, &sealed, NULL) && sealed;
            x->next_id += 2;
        }
        /* the slot read from now holds the new write generation: write over it */
        x->ok = x->ok && fill_ids(x->mgr, x->next_id, 1);
        x->next_id += 1;
    }
    return dest_cb(&x->r->d, m, dst, err);
}

static void t_store_torn_read(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_err_t e;
    id_reader_t r;
    id_reader_init(&r);
    wh_store_t *mgr = wh_store_open(&c, &e), *rd[2] = {NULL, NULL};
    REQUIRE(mgr, "open: %s", e.message);
    bool lead, sealed;
    REQUIRE(wh_store_lead(mgr, &lead, &e) && lead, "lead");
    race_ctx_t x = {.mgr = mgr, .next_id = 1000, .r = &r};
    for (int verify = 0; verify < 2; verify++) {
        wh_store_config_t cr = c;
        cr.verify_reads = verify;
        rd[verify] = wh_store_open(&cr, &e);
        REQUIRE(rd[verify], "open reader: %s", e.message);
        uint64_t g;
        /* top the write generation up (the last round left one sample in it) */
        uint32_t need = 2 - status_of(mgr).write_fill;
        uint64_t first = x.next_id;
        REQUIRE(fill_ids(mgr, x.next_id, need) && seal_once(mgr, &sealed, &g) && sealed, "seal");
        x.next_id += need;
        if (need < 2) {
            id_reader_t r0;
            id_reader_init(&r0);
            REQUIRE(wh_store_read(mgr, g, 0, dest_cb, &r0.d, NULL, &e), "read: %s", e.message);
            first = (uint64_t)r0.id;
        }
        x.fired = false;
        r.id = -1;
        wh_sample_meta_t m;
        bool ok = wh_store_read(rd[verify], g, 0, race_dest, &x, &m, &e);
        CHECK(x.fired && x.ok, "verify=%d: the callback could not seal and overwrite", verify);
        CHECK(!ok && e.code == WH_E_GONE,
              "verify=%d: torn read returned ok=%d code %d id %lld "
              "(sample put as %llu)",
              verify, ok, ok ? 0 : e.code, (long long)r.id, (unsigned long long)first);
    }
out:
    wh_store_destroy(rd[0]);
    wh_store_destroy(rd[1]);
    wh_store_destroy(mgr);
    clean_store(&c);
}

/* A node-local copy records its source at creation: openers with another
 * source, or with one where the store records none, are refused naming
 * both; so is an opener with none (a plain store's: a copy is written by
 * its relay alone). clean removes a copy only as its store's copy, a plain
 * store only as one; a refused clean removes nothing. */
static void t_store_origin(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 4, 64 << 10, &s), d, p;
    c.origin_id = "0123456789abcdef";
    c.origin_name = "mongodb://a:1/db1 (prefix wh)";
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e), *o = NULL;
    wh_status_t stt;
    REQUIRE(st, "open: %s", e.message);
    REQUIRE(wh_store_status(st, &stt, &e), "status: %s", e.message);
    CHECK(!strcmp(stt.origin_id, c.origin_id) && !strcmp(stt.origin_name, c.origin_name),
          "status: '%s' '%s'", stt.origin_id, stt.origin_name);
    o = wh_store_open(&c, &e); /* the same source */
    CHECK(o, "same source refused: %s", e.message);
    wh_store_destroy(o);
    d = c;
    d.origin_id = "fedcba9876543210";
    d.origin_name = "mongodb://b:2/db2 (prefix wh)";
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_SCHEMA && strstr(e.message, c.origin_name) &&
              strstr(e.message, d.origin_name),
          "another source: %s", e.message);
    wh_store_destroy(o);
    d.origin_id = "";
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_INVALID, "empty origin_id accepted");
    wh_store_destroy(o);
    d = c;
    d.origin_id = d.origin_name = NULL;
    o = wh_store_open(&d, &e); /* a plain opener: a generator, a manager, a plain reader */
    CHECK(!o && e.code == WH_E_SCHEMA && strstr(e.message, "is this node's copy of") &&
              strstr(e.message, c.origin_name),
          "plain opener of a copy: %s", o ? "opened" : e.message);
    wh_store_destroy(o);
    o = NULL;
    CHECK(!wh_store_clean(&d, &e) && e.code == WH_E_SCHEMA && strstr(e.message, c.origin_name) &&
              strstr(e.message, "nothing removed") && seg_exists(c.uri),
          "plain clean of a copy: %s", e.message);
    d.origin_id = "fedcba9876543210";
    d.origin_name = "mongodb://b:2/db2 (prefix wh)";
    CHECK(!wh_store_clean(&d, &e) && e.code == WH_E_SCHEMA && strstr(e.message, c.origin_name) &&
              seg_exists(c.uri),
          "clean of another source's copy: %s", e.message);
    /* one server, two spellings: refused all the same, saying so */
    d.origin_name = "mongodb://b:2/db1 (prefix wh)";
    o = wh_store_open(&d, &e);
    CHECK(!o && strstr(e.message, "differ only in how the hosts are written (a:1 in the copy, "
                                  "b:2 here)"),
          "hosts spelled differently: %s", o ? "opened" : e.message);
    wh_store_destroy(o);
    o = NULL;
    d.origin_name = "mongodb://a:1/db2 (prefix wh)"; /* another database: no such hint */
    o = wh_store_open(&d, &e);
    CHECK(!o && !strstr(e.message, "hosts are written"), "hint for another database: %s",
          o ? "opened" : e.message);
    wh_store_destroy(o);
    o = NULL;
    p = mkcfg(new_uri(), 4, 64 << 10, &s); /* a plain store is no copy */
    o = wh_store_open(&p, &e);
    REQUIRE(o, "plain open: %s", e.message);
    wh_store_destroy(o);
    d = p;
    d.origin_id = c.origin_id;
    d.origin_name = c.origin_name;
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_SCHEMA && strstr(e.message, "records no source") &&
              strstr(e.message, c.origin_name),
          "plain store as a copy: %s", e.message);
    wh_store_destroy(o);
    CHECK(!wh_store_clean(&d, &e) && e.code == WH_E_SCHEMA &&
              strstr(e.message, "records no source") && seg_exists(p.uri),
          "a copy's clean of a plain store: %s", e.message);
    clean_store(&p);
    CHECK(!seg_exists(p.uri), "a plain clean left the plain store");
out:
    wh_store_destroy(st);
    clean_store(&c);
}

static void t_store_open_errors(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    static const char *const n3[] = {"id", "data", "extra"};
    static const char *const n2b[] = {"id", "label"};
    wh_schema_t s3 = schema_of(3, n3), s2b = schema_of(2, n2b);
    wh_store_config_t c = mkcfg(new_uri(), 4, 64 << 10, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e), *o = NULL;
    REQUIRE(st, "open: %s", e.message);
    wh_store_config_t d = c;
    d.schema = s3;
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_SCHEMA && strstr(e.message, "SAMPLE"), "3 fields: %s", e.message);
    wh_store_destroy(o);
    d.schema = s2b;
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_SCHEMA && strstr(e.message, "id, data"),
          "renamed field (message should list the store's fields): %s", e.message);
    wh_store_destroy(o);
    d = c;
    d.swap_cap = 5;
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_SCHEMA && strstr(e.message, "SWAP_CAP"), "swap_cap: %s", e.message);
    wh_store_destroy(o);
    d = c;
    d.swap_cap = 0;
    d.uri = "shm://whctest-never-made";
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_INVALID, "swap_cap 0");
    wh_store_destroy(o);
    d.swap_cap = 4;
    d.byte_budget = 100;
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_INVALID, "budget 100");
    wh_store_destroy(o);
    CHECK(!seg_exists(d.uri), "a refused open left a segment");
    d = c;
    const char *bad[] = {"shm://", "shm://a/b", "shm://../x", "shm://sp ace", "shm://x\n"};
    for (size_t i = 0; i < WH_ARRAY_LEN(bad); i++) {
        d.uri = bad[i];
        o = wh_store_open(&d, &e);
        CHECK(!o && e.code == WH_E_INVALID, "name '%s' accepted", bad[i]);
        wh_store_destroy(o);
    }
    d.uri = "file:///tmp/x";
    o = wh_store_open(&d, &e);
    CHECK(!o && e.code == WH_E_INVALID, "unknown scheme");
    wh_store_destroy(o);
out:
    wh_store_destroy(st);
    clean_store(&c);
}

static void t_store_toobig(void) {
    static const char *const names[] = {"x"};
    wh_schema_t s = schema_of(1, names);
    wh_store_config_t c = mkcfg(new_uri(), 10, 16 << 10, &s);
    wh_err_t e;
    static unsigned char big[64 << 10], mid[5000];
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    wh_put_status_t ps;
    wh_array_t a = arr1(WH_DT_U8, sizeof big, 1, big);
    CHECK(!wh_store_put(st, &a, 1, 1000, &ps, NULL, &e) && e.code == WH_E_TOOBIG &&
              strstr(e.message, "BYTE_BUDGET"),
          "sample larger than the budget: code %d (%s)", e.code, e.message);
    wh_status_t s0 = status_of(st);
    CHECK(s0.write_fill == 0 && s0.write_bytes == 0 && s0.generated == 0, "nothing stored");
    /* 3 samples of ~5 KB fit 16 KiB, the 4th cannot and no seal can come
     * (3 < SWAP_CAP): an error, at once, not a wait */
    a = arr1(WH_DT_U8, sizeof mid, 1, mid);
    for (int i = 0; i < 3; i++)
        CHECK(wh_store_put(st, &a, 1, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "put %d: %s",
              i, e.message);
    uint64_t t0 = wh_now_mono_ns();
    bool ok = wh_store_put(st, &a, 1, 10000, &ps, NULL, &e);
    CHECK(!ok && e.code == WH_E_TOOBIG && strstr(e.message, "BYTE_BUDGET"),
          "budget exhausted below SWAP_CAP: ok=%d status %d code %d (%s)", ok, ps, e.code,
          e.message);
    CHECK(secs_since(t0) < 2.0, "took %.2f s: waited instead of failing", secs_since(t0));
    s0 = status_of(st);
    CHECK(s0.write_fill == 3 && s0.generated == 3, "accepted samples kept: fill %u", s0.write_fill);
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* Puts never block on a full generation: surplus is discarded at once. */
static void t_store_discard_fast(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 8 << 10, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    REQUIRE(fill_ids(st, 0, 2), "fill");
    uint64_t t0 = wh_now_mono_ns();
    for (int i = 0; i < 100; i++) {
        wh_put_status_t ps;
        CHECK(put_id(st, 500, &ps, NULL, &e) && ps == WH_PUT_DISCARDED, "surplus put %d", i);
    }
    CHECK(secs_since(t0) < 1.0, "discarding 100 puts took %.2f s", secs_since(t0));
    CHECK(status_of(st).discarded == 100, "discard count");
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* ---- leases ----------------------------------------------------------- */

static void t_lease_handles(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_store_config_t cshort = c;
    cshort.lease_s = 0.3;
    wh_err_t e;
    wh_store_t *a = wh_store_open(&cshort, &e), *b = wh_store_open(&c, &e);
    REQUIRE(a && b, "open: %s", e.message);
    bool la = false, lb = true, sealed = true;
    CHECK(wh_store_lead(a, &la, &e) && la, "first handle leads");
    CHECK(wh_store_lead(b, &lb, &e) && !lb, "second handle must not lead while the first holds it");
    REQUIRE(fill_ids(a, 0, 2), "fill");
    wh_seal_info_t info;
    CHECK(!wh_store_seal(b, &sealed, &info, &e) && e.code == WH_E_LEASE && !sealed,
          "seal by a non-leader: code %d", e.code);
    CHECK(status_of(b).read_gen == 0, "non-leader's seal changed nothing");
    CHECK(wh_store_lead(a, &la, &e) && la, "the holder renews");
    /* the 0.3 s lease runs out while its holder stays silent */
    uint64_t t0 = wh_now_mono_ns();
    lb = false;
    while (!lb && secs_since(t0) < 10.0) {
        CHECK(wh_store_lead(b, &lb, &e), "lead: %s", e.message);
        if (!lb) wh_sleep_ms(5);
    }
    double took = secs_since(t0);
    CHECK(lb && took > 0.2, "takeover after expiry: leader=%d after %.2f s", lb, took);
    CHECK(!wh_store_seal(a, &sealed, &info, &e) && e.code == WH_E_LEASE,
          "the expired holder may not seal: code %d", e.code);
    CHECK(wh_store_lead(a, &la, &e) && !la, "the expired holder cannot take it back");
    CHECK(wh_store_seal(b, &sealed, &info, &e) && sealed, "the new leader seals: %s", e.message);
    CHECK(wh_store_resign(b, &e), "resign");
    CHECK(status_of(a).leader_pid == 0, "no leader after resign");
    CHECK(wh_store_lead(a, &la, &e) && la, "lead right after resign");
    CHECK(wh_store_resign(b, &e), "resign by a non-holder is harmless");
    CHECK(wh_store_lead(b, &lb, &e) && !lb, "a non-holder's resign did not free the lease");
out:
    wh_store_destroy(a);
    wh_store_destroy(b);
    clean_store(&c);
}

/* A child leads and exits without resigning (status 0), or is SIGKILLed
 * holding the lease: the parent leads at once, long before the 30 s
 * lease would expire. */
static void t_lease_dead_child(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    for (int mode = 0; mode < 2; mode++) {
        int pfd[2];
        REQUIRE(pipe(pfd) == 0, "pipe");
        fflush(NULL);
        pid_t pid = fork();
        REQUIRE(pid >= 0, "fork");
        if (pid == 0) {
            close(pfd[0]);
            wh_err_t ce;
            wh_store_t *cs = wh_store_open(&c, &ce);
            bool l = false;
            if (!cs || !wh_store_lead(cs, &l, &ce) || !l) _exit(3);
            if (write(pfd[1], "L", 1) != 1) _exit(4);
            if (mode == 0) _exit(0); /* exits holding the lease */
            for (;;) pause();
        }
        kid_add(pid);
        close(pfd[1]);
        bool got = wait_for_line(pfd[0], "L", 20000);
        close(pfd[0]);
        CHECK(got, "child %d did not report leading", mode);
        bool l = true;
        CHECK(wh_store_lead(st, &l, &e) && !l,
              "mode %d: the child's lease must hold while it lives", mode);
        int wst = 0;
        if (mode == 1) kill(pid, SIGKILL);
        waitpid(pid, &wst, 0);
        kid_forget(pid);
        CHECK(mode == 1 ? (WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL)
                        : (WIFEXITED(wst) && WEXITSTATUS(wst) == 0),
              "mode %d child status %#x", mode, wst);
        uint64_t t0 = wh_now_mono_ns();
        CHECK(wh_store_lead(st, &l, &e) && l, "mode %d: dead leader not replaced at once", mode);
        CHECK(secs_since(t0) < 1.0, "lead took %.2f s", secs_since(t0));
        CHECK(status_of(st).leader_pid == (uint64_t)getpid(), "status shows the new leader");
        CHECK(wh_store_resign(st, &e), "resign");
    }
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* A segment others may write, or another user's, is refused with a
 * message saying why; set right again, it opens. */
static void t_segment_owner_mode(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    wh_store_destroy(st);
    char p[160];
    snprintf(p, sizeof p, "/dev/shm/wirehead.%s", c.uri + strlen("shm://"));
    REQUIRE(chmod(p, 0666) == 0, "chmod: %s", strerror(errno));
    st = wh_store_open(&c, &e);
    CHECK(!st && e.code == WH_E_INVALID && strstr(e.message, "mode 666") &&
              strstr(e.message, "0600"),
          "mode 0666 must be refused naming the mode: %s", st ? "opened" : e.message);
    wh_store_destroy(st);
    REQUIRE(chmod(p, 0600) == 0, "chmod: %s", strerror(errno));
    if (geteuid() == 0) { /* only root can give a file away */
        REQUIRE(chown(p, 12345, (gid_t)-1) == 0, "chown: %s", strerror(errno));
        st = wh_store_open(&c, &e);
        CHECK(!st && e.code == WH_E_INVALID && strstr(e.message, "uid 12345"),
              "another user's segment must be refused naming the owner: %s",
              st ? "opened" : e.message);
        wh_store_destroy(st);
        REQUIRE(chown(p, geteuid(), (gid_t)-1) == 0, "chown: %s", strerror(errno));
    }
    st = wh_store_open(&c, &e);
    CHECK(st, "owned, mode 0600: opens again: %s", e.message);
    wh_store_destroy(st);
out:
    clean_store(&c);
}

/* ---- hostile bytes in the segment ------------------------------------ */

static unsigned char *map_segment(const wh_store_config_t *c, size_t *len, char *path, size_t cap) {
    snprintf(path, cap, "/dev/shm/wirehead.%s", c->uri + strlen("shm://"));
    int fd = open(path, O_RDWR);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) return NULL;
    *len = (size_t)sb.st_size;
    void *m = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

static unsigned char *area_of(unsigned char *seg, const wh_shm_layout_t *L, uint64_t gen) {
    for (int i = 0; i < 4; i++) {
        unsigned char *a = seg + L->slots + (size_t)i * L->slot_size;
        if (get64(a + L->slot_gen) == gen) return a;
    }
    return NULL;
}

/* Forged counts and offsets in the write area: puts fail naming the
 * damage (no SIGSEGV, no wrapped offset); repaired, the store goes on. */
static void t_hostile_area(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 4, 64 << 10, &s);
    wh_err_t e;
    wh_put_status_t ps;
    wh_shm_layout_t L;
    wh_shm_layout(&L);
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    REQUIRE(fill_ids(st, 0, 1), "first put");
    size_t len;
    char path[160];
    unsigned char *seg = map_segment(&c, &len, path, sizeof path);
    REQUIRE(seg, "map the segment");
    unsigned char *a = area_of(seg, &L, status_of(st).write_gen);
    REQUIRE(a, "write area");
    uint32_t nholes = 100000;
    memcpy(a + L.slot_nholes, &nholes, 4);
    CHECK(!put_id(st, 1, &ps, NULL, &e) && e.code == WH_E_CORRUPT &&
              strstr(e.message, "hole count"),
          "forged nholes: %s", e.message);
    nholes = 1;
    memcpy(a + L.slot_nholes, &nholes, 4);
    put64(a + L.slot_holes, 1ull << 63);
    put64(a + L.slot_holes + 8, 1ull << 63);
    CHECK(!put_id(st, 1, &ps, NULL, &e) && e.code == WH_E_CORRUPT &&
              strstr(e.message, "hole outside"),
          "forged hole: %s", e.message);
    nholes = 0;
    memcpy(a + L.slot_nholes, &nholes, 4);
    uint64_t used = get64(a + L.slot_used);
    put64(a + L.slot_used, UINT64_MAX - 10);
    CHECK(!put_id(st, 1, &ps, NULL, &e) && e.code == WH_E_CORRUPT &&
              strstr(e.message, "used bytes"),
          "forged used: %s", e.message);
    put64(a + L.slot_used, used);
    /* repaired: nothing stored was lost, puts go on */
    CHECK(fill_ids(st, 1, 3) && status_of(st).write_fill == 4, "puts after repair");
    bool sealed;
    CHECK(wh_store_lead(st, &sealed, &e) && seal_once(st, &sealed, NULL) && sealed, "seal");
    uint64_t g = status_of(st).read_gen;
    wh_sample_meta_t m;
    for (uint32_t p = 0; p < 4; p++)
        CHECK(wh_store_read(st, g, p, NULL, NULL, &m, &e), "read %u: %s", p, e.message);
    /* truncated under this handle: an error, not SIGBUS */
    REQUIRE(truncate(path, (off_t)(len / 2)) == 0, "truncate: %s", strerror(errno));
    munmap(seg, len);
    CHECK(!wh_store_read(st, g, 0, NULL, NULL, &m, &e) && e.code == WH_E_CORRUPT &&
              strstr(e.message, "truncated"),
          "read of a truncated segment: %s", e.message);
    CHECK(!put_id(st, 9, &ps, NULL, &e) && strstr(e.message, "truncated"),
          "put into a truncated segment: %s", e.message);
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* A lock holder stopped (SIGSTOP) delays others at most LEASE_SECONDS;
 * status does not wait for it; a forged far lease does not block takeover. */
static void t_hostile_locks(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    c.lease_s = 0.3;
    wh_err_t e;
    wh_shm_layout_t L;
    wh_shm_layout(&L);
    pid_t child = -1;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    size_t len;
    char path[160];
    unsigned char *seg = map_segment(&c, &len, path, sizeof path);
    REQUIRE(seg, "map the segment");
    int pfd[2];
    REQUIRE(pipe(pfd) == 0, "pipe");
    child = fork();
    if (child == 0) { /* holds the header lock as a put or seal would, then stops */
        int32_t me = (int32_t)getpid(), free_ = 0;
        if (!__atomic_compare_exchange_n((int32_t *)(seg + L.hdr_lock), &free_, me, false,
                                         __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            _exit(1);
        char one = 1;
        if (write(pfd[1], &one, 1) != 1) _exit(1);
        raise(SIGSTOP);
        _exit(0);
    }
    char got = 0;
    REQUIRE(child > 0 && read(pfd[0], &got, 1) == 1, "child holds the lock");
    uint64_t t0 = wh_now_mono_ns();
    wh_status_t o;
    CHECK(wh_store_status(st, &o, &e), "status with the lock held: %s", e.message);
    CHECK(secs_since(t0) < 1.5, "status waited %.2f s", secs_since(t0));
    bool lead = true;
    t0 = wh_now_mono_ns();
    char held_by[32];
    snprintf(held_by, sizeof held_by, "pid %d", (int)child);
    CHECK(!wh_store_lead(st, &lead, &e) && e.code == WH_E_TIMEOUT && strstr(e.message, "stopped") &&
              strstr(e.message, held_by),
          "lead with a stopped holder: %s", e.message);
    double took = secs_since(t0);
    CHECK(took >= 0.25 && took < 3.0, "lead waited %.2f s for a 0.3 s lease", took);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    child = -1;
    CHECK(wh_store_lead(st, &lead, &e) && lead, "the dead holder's lock is recovered: %s",
          e.message);
    CHECK(wh_store_resign(st, &e), "resign");
    /* a forged lease: pid 1 (alive), expiry in a century */
    int64_t one_pid = 1;
    memcpy(seg + L.leader_pid, &one_pid, 8);
    put64(seg + L.leader_token, 12345);
    put64(seg + L.lease_expiry_ns, wh_now_real_ns() + 100ull * 365 * 24 * 3600 * 1000000000ull);
    put64(seg + L.lease_ns, 0);
    CHECK(wh_store_lead(st, &lead, &e) && lead, "a forged far lease is taken over");
    CHECK(wh_store_resign(st, &e), "resign");
    /* a live-looking lease of pid 2^32 + 1, which a cast to pid_t would make pid 1 */
    int64_t wide_pid = (1ll << 32) + 1;
    memcpy(seg + L.leader_pid, &wide_pid, 8);
    put64(seg + L.leader_token, 12345);
    put64(seg + L.lease_ns, 30ull * 1000000000ull);
    put64(seg + L.lease_expiry_ns, wh_now_real_ns() + 20ull * 1000000000ull);
    CHECK(wh_store_lead(st, &lead, &e) && lead, "a lease of pid 2^32 + 1 is no one's");
    CHECK(status_of(st).leader_pid == (uint64_t)getpid(), "leader after takeover");
    /* garbage in the lock words (the bytes fuzz_segment once aborted glibc's
     * robust mutex with, and all ones): a lock nobody alive holds is taken */
    static const unsigned char fuzz_found[] = {0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32, 0x32};
    for (int k = 0; k < 2; k++) {
        if (k == 0)
            memcpy(seg + L.hdr_lock, fuzz_found, sizeof fuzz_found);
        else
            memset(seg + L.hdr_lock, 0xff, 8);
        t0 = wh_now_mono_ns();
        CHECK(wh_store_lead(st, &lead, &e) && lead, "lead over a garbage lock %d: %s", k,
              e.message);
        CHECK(wh_store_status(st, &o, &e), "status over a garbage lock: %s", e.message);
        CHECK(secs_since(t0) < 1.0, "garbage lock %d: calls took %.2f s", k, secs_since(t0));
    }
    munmap(seg, len);
out:
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    wh_store_destroy(st);
    clean_store(&c);
}

/* A handle used after fork refuses instead of corrupting state. */
static void t_fork_handle(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        wh_err_t ce;
        wh_put_status_t ps;
        bool l;
        int rc = 0;
        if (put_id(st, 1, &ps, NULL, &ce) || ce.code != WH_E_INVALID) rc |= 1;
        if (wh_store_lead(st, &l, &ce) || ce.code != WH_E_INVALID) rc |= 2;
        _exit(rc);
    }
    kid_add(pid);
    int wst = 0;
    waitpid(pid, &wst, 0);
    kid_forget(pid);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "child status %#x (1: put, 2: lead accepted)",
          wst);
    CHECK(status_of(st).write_fill == 0, "the child's put stored something");
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* ---- a generator killed inside a put ---------------------------------- */

/* Forks a child that opens the store and puts one sample of big_bytes
 * with the fault pause set; returns once the child is paused inside the
 * put (its stderr said so), or -1. */
static pid_t spawn_paused_putter(const wh_store_config_t *c, size_t big_bytes) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(pfd[0]);
        if (dup2(pfd[1], 2) < 0) _exit(5);
        setenv("WIREHEAD_FAULT_PUT_PAUSE", "30", 1);
        wh_err_t ce;
        wh_store_t *cs = wh_store_open(c, &ce);
        if (!cs) _exit(3);
        static int64_t id = 999999;
        unsigned char *data = malloc(big_bytes);
        if (!data) _exit(6);
        memset(data, 0xC3, big_bytes);
        wh_array_t a[2] = {arr0(WH_DT_I64, &id), arr1(WH_DT_U8, (int64_t)big_bytes, 1, data)};
        wh_put_status_t ps;
        wh_store_put(cs, a, 2, 1000, &ps, NULL, &ce);
        _exit(4); /* the put returned: the pause did not happen */
    }
    kid_add(pid);
    close(pfd[1]);
    bool paused = wait_for_line(pfd[0], "wirehead: fault pause in put", 30000);
    close(pfd[0]);
    if (!paused) {
        kid_kill(pid);
        return -1;
    }
    return pid;
}

static void t_killed_put(void) {
    static const char *const names[] = {"id", "data"};
    wh_schema_t s = schema_of(2, names);
    const uint32_t cap = 4;
    wh_store_config_t c = mkcfg(new_uri(), cap, 4 << 20, &s);
    wh_err_t e;
    dest_t d;
    int64_t rid;
    static unsigned char rbuf[1 << 20];
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    bool lead, sealed;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    /* the data field here is uint8 so the child's 1 MiB sample fits the schema */
    unsigned char small[100];
    int64_t id;
    wh_array_t a[2] = {arr0(WH_DT_I64, &id), arr1(WH_DT_U8, sizeof small, 1, small)};
    wh_put_status_t ps;
    id = 1;
    memset(small, 1, sizeof small);
    CHECK(wh_store_put(st, a, 2, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "first put");
    wh_status_t before = status_of(st);

    pid_t pid = spawn_paused_putter(&c, 1 << 20);
    REQUIRE(pid > 0, "child never paused inside its put");
    wh_status_t mid = status_of(st);
    CHECK(mid.write_fill == before.write_fill && mid.generated == before.generated,
          "a half-written put is visible: fill %u", mid.write_fill);
    uint64_t gen0 = before.write_gen;
    /* while the child is paused: fill and seal its generation and the next */
    for (id = 2; id <= (int64_t)cap; id++) {
        memset(small, (int)id, sizeof small);
        CHECK(wh_store_put(st, a, 2, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "put %lld",
              (long long)id);
    }
    uint64_t g;
    CHECK(seal_once(st, &sealed, &g) && sealed && g == gen0, "seal with a writer paused");
    kid_kill(pid);
    wh_status_t after = status_of(st);
    CHECK(after.generated == cap && after.read_gen == gen0, "killed writer counted: generated %llu",
          (unsigned long long)after.generated);
    d = (dest_t){.buf = {&rid, rbuf}, .cap = {8, sizeof rbuf}};
    for (uint32_t pos = 0; pos < cap; pos++) {
        wh_sample_meta_t m;
        bool ok = wh_store_read(st, gen0, pos, dest_cb, &d, &m, &e);
        CHECK(ok && rid == pos + 1 && m.f[1].nbytes == sizeof small &&
                  rbuf[0] == (unsigned)(pos + 1),
              "pos %u: id %lld (%s)", pos, (long long)rid, ok ? "" : e.message);
    }
    /* the slot the dead writer reserved in is recycled 4 seals later (4
     * areas): its reservation must be pruned or that seal would never happen */
    for (int k = 1; k <= 4; k++) {
        for (uint32_t i = 0; i < cap; i++) {
            id = 100 * k + i;
            CHECK(wh_store_put(st, a, 2, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED,
                  "put after the kill: status %d %s", ps, e.message);
        }
        CHECK(seal_once(st, &sealed, &g) && sealed && g == gen0 + (uint64_t)k,
              "seal %d after the kill: sealed=%d", k, sealed);
    }
    CHECK(wh_store_read(st, gen0 + 4, 0, dest_cb, &d, NULL, &e) && rid == 400, "read: %s",
          e.message);
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* ---- a self-sealing generator SIGKILLed at every step of a seal -------- */

/* Waits for a fault child: 1 if a fault point SIGKILLed it, 0 if it ended
 * on its own (exit 0: the call had fewer steps), -1 on any other end. */
static int kid_fate(pid_t pid, const char *what, const char *fault) {
    kid_add(pid);
    int wst = 0;
    while (waitpid(pid, &wst, 0) < 0 && errno == EINTR) {
    }
    kid_forget(pid);
    if (WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL) return 1;
    if (WIFEXITED(wst) && WEXITSTATUS(wst) == 0) return 0;
    fprintf(stderr, "  %s (%s) ended with status %#x\n", what, fault, wst);
    return -1;
}

/* Forks a child that opens the store, takes the lease and seals with
 * WIREHEAD_FAULT_SEAL_KILL=step. Returns 1 if it was killed at that step, 0
 * if its seal returned (it has fewer steps, or found nothing to seal), -1 on
 * any other end. */
static int seal_child(const wh_store_config_t *c, int step) {
    char v[16];
    snprintf(v, sizeof v, "%d", step);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setenv("WIREHEAD_FAULT_SEAL_KILL", v, 1);
        if (freopen("/dev/null", "w", stderr) == NULL) _exit(5);
        wh_err_t ce;
        wh_store_t *cs = wh_store_open(c, &ce);
        bool l = false, sealed = false;
        wh_seal_info_t info;
        memset(&info, 0, sizeof info);
        if (!cs || !wh_store_lead(cs, &l, &ce) || !l) _exit(3);
        if (!wh_store_seal(cs, &sealed, &info, &ce)) _exit(4);
        _exit(0); /* no write of this seal is numbered step */
    }
    return kid_fate(pid, "seal child", v);
}

/* Reads all of generation gen: every sample well-formed, the ids exactly
 * [first, first + cap) in put order. */
static bool gen_holds(wh_store_t *st, uint64_t gen, uint32_t cap, uint64_t first) {
    id_reader_t *r = malloc(sizeof *r);
    if (!r) return false;
    bool ok = true;
    for (uint32_t pos = 0; pos < cap && ok; pos++) {
        id_reader_init(r);
        wh_sample_meta_t m;
        wh_err_t e;
        char why[200] = "";
        if (!wh_store_read(st, gen, pos, dest_cb, &r->d, &m, &e)) {
            fprintf(stderr, "  generation %llu pos %u: %s\n", (unsigned long long)gen, pos,
                    e.message);
            ok = false;
        } else if (!id_sample_ok(r, &m, why, sizeof why) || (uint64_t)r->id != first + pos) {
            fprintf(stderr, "  generation %llu pos %u: id %lld, want %llu %s\n",
                    (unsigned long long)gen, pos, (long long)r->id,
                    (unsigned long long)(first + pos), why);
            ok = false;
        }
    }
    free(r);
    return ok;
}

/* No two areas hold one generation. */
static bool areas_distinct(wh_store_t *st) {
    wh_status_t s = status_of(st);
    for (int i = 0; i < s.nareas; i++)
        for (int j = i + 1; j < s.nareas; j++)
            if (s.areas[i].generation && s.areas[i].generation == s.areas[j].generation) {
                fprintf(stderr, "  areas %d and %d both hold generation %llu\n", i, j,
                        (unsigned long long)s.areas[i].generation);
                return false;
            }
    return true;
}

/* For every step k1 a first sealer dies at, and every step k2 (0: none) the
 * next sealer dies at (the repair of a half-done seal included), a third
 * participant's puts fill the next generation and its seal gives exactly
 * SWAP_CAP distinct, correct samples; the generation being sealed stays
 * exact too. Every area has held a generation before, so a half-reset area
 * would still carry the old generation's index and counts. */
static void t_seal_killed_every_step(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    const uint32_t cap = 4;
    int steps = 0, runs = 0;
    wh_store_t *st = NULL;
    wh_store_config_t c = mkcfg(new_uri(), cap, 1 << 20, &s); /* re-created for each run */
    for (int k1 = 1; k1 <= 32 && !steps; k1++) {
        for (int k2 = 0; k2 <= 32; k2++) {
            wh_err_t e;
            st = wh_store_open(&c, &e);
            REQUIRE(st, "open: %s", e.message);
            bool lead, sealed;
            uint64_t id = 1, g = 0;
            for (int i = 0; i < 5; i++) { /* every area used once */
                REQUIRE(fill_ids(st, id, cap), "fill");
                id += cap;
                REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
                REQUIRE(seal_once(st, &sealed, &g) && sealed, "seal %d", i);
                REQUIRE(wh_store_resign(st, &e), "resign");
            }
            uint64_t w = status_of(st).write_gen, wfirst = id;
            REQUIRE(fill_ids(st, id, cap), "fill the generation to seal");
            id += cap;
            int r1 = seal_child(&c, k1);
            REQUIRE(r1 >= 0, "first sealer, step %d", k1);
            if (r1 == 0) { /* the seal has k1 - 1 steps: it sealed */
                steps = k1 - 1;
                wh_store_destroy(st);
                st = NULL;
                clean_store(&c);
                break;
            }
            int r2 = k2 ? seal_child(&c, k2) : 0;
            REQUIRE(r2 >= 0, "second sealer, steps %d then %d", k1, k2);
            runs++;
            REQUIRE(areas_distinct(st), "after kills at steps %d then %d", k1, k2);
            /* the next participant: seals w if nobody finished it, fills w + 1 */
            REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead after the kills: %s", e.message);
            wh_status_t now = status_of(st);
            if (now.write_gen == w) {
                REQUIRE(seal_once(st, &sealed, &g) && sealed && g == w,
                        "steps %d/%d: the repairing seal sealed=%d generation %llu, want %llu", k1,
                        k2, sealed, (unsigned long long)g, (unsigned long long)w);
            }
            now = status_of(st);
            REQUIRE(now.write_gen == w + 1 && now.read_gen == w && now.write_fill == 0,
                    "steps %d/%d: write %llu (fill %u) read %llu, want write %llu read %llu", k1,
                    k2, (unsigned long long)now.write_gen, now.write_fill,
                    (unsigned long long)now.read_gen, (unsigned long long)(w + 1),
                    (unsigned long long)w);
            CHECK(gen_holds(st, w, cap, wfirst), "steps %d/%d: generation %llu", k1, k2,
                  (unsigned long long)w);
            REQUIRE(fill_ids(st, id, cap), "steps %d/%d: puts into generation %llu", k1, k2,
                    (unsigned long long)(w + 1));
            REQUIRE(seal_once(st, &sealed, &g) && sealed && g == w + 1, "steps %d/%d: seal", k1,
                    k2);
            CHECK(gen_holds(st, w + 1, cap, id), "steps %d/%d: generation %llu", k1, k2,
                  (unsigned long long)(w + 1));
            CHECK(areas_distinct(st), "steps %d/%d: after the seals", k1, k2);
            wh_store_destroy(st);
            st = NULL;
            clean_store(&c);
            if (!case_ok) return;
            if (k2 && r2 == 0) break; /* every step of the second seal done */
        }
    }
    CHECK(steps >= 7, "the seal has %d numbered writes, expected at least 7", steps);
    fprintf(stderr, "     %d steps per seal, %d kill runs\n", steps, runs);
    return;
out:
    if (st) wh_store_destroy(st);
    clean_store(&c);
}

/* A live writer paused inside a put in generation G keeps G's slot from
 * being recycled: with 4 areas seals go on in the other slots (a single
 * busy slot never blocks), G stays readable far past its usual 4 seals;
 * once the writer is killed the next seal recycles G's slot. */
static void t_live_writer_blocks_recycle(void) {
    static const char *const names[] = {"id", "data"};
    wh_schema_t s = schema_of(2, names);
    wh_store_config_t c = mkcfg(new_uri(), 2, 2 << 20, &s);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    bool lead, sealed;
    uint64_t g0 = 0;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    pid_t pid = spawn_paused_putter(&c, 256 << 10);
    REQUIRE(pid > 0, "child never paused");
    unsigned char small[64] = {0};
    int64_t id = 0, rid = -1;
    unsigned char rbuf[64];
    dest_t d = {.buf = {&rid, rbuf}, .cap = {8, sizeof rbuf}};
    wh_array_t a[2] = {arr0(WH_DT_I64, &id), arr1(WH_DT_U8, sizeof small, 1, small)};
    wh_put_status_t ps;
    uint64_t g = 0;
    for (int k = 0; k < 8; k++) {
        for (int i = 0; i < 2; i++, id++)
            CHECK(wh_store_put(st, a, 2, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "put");
        CHECK(seal_once(st, &sealed, &g) && sealed, "seal %d with a paused writer", k);
        if (k == 0) g0 = g;
    }
    CHECK(wh_store_read(st, g0, 0, dest_cb, &d, NULL, &e) && rid == 0,
          "the paused writer's generation after 8 seals: %s", e.message);
    kid_kill(pid);
    for (int i = 0; i < 2; i++, id++)
        CHECK(wh_store_put(st, a, 2, 1000, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED, "put");
    CHECK(seal_once(st, &sealed, &g) && sealed, "seal after the writer died");
    CHECK(!wh_store_read(st, g0, 0, dest_cb, &d, NULL, &e) && e.code == WH_E_GONE,
          "its slot is recycled once it died: code %d", e.code);
out:
    wh_store_destroy(st);
    clean_store(&c);
}

/* With a budget of exactly SWAP_CAP samples: while a writer is paused
 * inside a put holding its reservation, a put that does not fit waits
 * (WH_PUT_WAIT after wait_ms, nothing stored). Once that writer is
 * SIGKILLed it must not wedge the store: the others still fill the
 * generation and the manager seals it (guarantee 6: a dead generator
 * stalls nothing). */
static void t_killed_put_tight_budget(void) {
    static const char *const names[] = {"id", "data"};
    wh_schema_t s = schema_of(2, names);
    const uint32_t cap = 4;
    /* header 64 + 2 x 96 = 256; id at 256 (8 bytes, padded to 64); data at
     * 320: 65216 bytes make every sample exactly 64 KiB */
    const size_t data_bytes = 65536 - 320;
    wh_store_config_t c = mkcfg(new_uri(), cap, cap * 65536, &s);
    wh_err_t e;
    unsigned char *data = malloc(data_bytes);
    wh_store_t *st = wh_store_open(&c, &e);
    REQUIRE(st && data, "open: %s", e.message);
    bool lead, sealed = false;
    REQUIRE(wh_store_lead(st, &lead, &e) && lead, "lead");
    int64_t id = 0;
    memset(data, 7, data_bytes);
    wh_array_t a[2] = {arr0(WH_DT_I64, &id), arr1(WH_DT_U8, (int64_t)data_bytes, 1, data)};
    wh_sample_meta_t m;
    REQUIRE(wh_sample_plan(&s, a, 2, &m, &e) && m.total_size == 65536, "sample is %llu bytes",
            (unsigned long long)m.total_size);
    pid_t pid = spawn_paused_putter(&c, data_bytes);
    REQUIRE(pid > 0, "child never paused");
    uint32_t accepted = 0;
    wh_put_status_t ps = WH_PUT_ACCEPTED;
    for (; accepted < cap - 1; accepted++, id++)
        REQUIRE(wh_store_put(st, a, 2, 100, &ps, NULL, &e) && ps == WH_PUT_ACCEPTED,
                "put %u: status %d %s", accepted, ps, e.message);
    /* backpressure: the budget is full, a live writer still holds bytes */
    uint64_t t0 = wh_now_mono_ns();
    bool ok = wh_store_put(st, a, 2, 200, &ps, NULL, &e);
    double waited = secs_since(t0);
    CHECK(ok && ps == WH_PUT_WAIT, "put with the budget full: ok=%d status %d %s", ok, ps,
          ok ? "" : e.message);
    CHECK(waited >= 0.15 && waited < 5.0, "waited %.3f s for a 200 ms wait", waited);
    CHECK(status_of(st).write_fill == cap - 1, "a WH_PUT_WAIT put stored something");
    kid_kill(pid);
    wh_err_t last = {0, ""};
    t0 = wh_now_mono_ns();
    while (accepted < cap && secs_since(t0) < 5.0) {
        if (!wh_store_put(st, a, 2, 100, &ps, NULL, &e)) {
            last = e;
            wh_sleep_ms(10);
            continue;
        }
        if (ps == WH_PUT_ACCEPTED) accepted++, id++;
    }
    CHECK(accepted == cap,
          "only %u of %u puts accepted after a writer died holding 64 KiB of "
          "a tight budget; last error: %s",
          accepted, cap, last.message);
    CHECK(seal_once(st, &sealed, NULL) && sealed, "seal after the dead writer");
out:
    wh_store_destroy(st);
    clean_store(&c);
    free(data);
}

/* ---- creation ---------------------------------------------------------- */

/* A segment left by a creator that died before finishing (its header's
 * pages and more, zero-filled, so no magic and creator pid 0) is replaced
 * within the open timeout. */
static void t_stale_segment(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    off_t sizes[2] = {64 << 10, 1 << 20};
    for (int k = 0; k < 2; k++) {
        wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
        char sn[128];
        seg_name(c.uri, sn, sizeof sn);
        int fd = shm_open(sn, O_RDWR | O_CREAT | O_EXCL, 0600);
        CHECK(fd >= 0, "shm_open: %s", strerror(errno));
        if (fd < 0) continue;
        CHECK(ftruncate(fd, sizes[k]) == 0, "ftruncate");
        close(fd);
        wh_err_t e;
        uint64_t t0 = wh_now_mono_ns();
        wh_store_t *st = wh_store_open(&c, &e);
        double took = secs_since(t0);
        CHECK(st, "size %lld: open over a stale segment: %s", (long long)sizes[k], e.message);
        CHECK(took < 15.0, "took %.1f s", took);
        if (st) {
            bool lead, sealed;
            CHECK(wh_store_lead(st, &lead, &e) && lead, "lead");
            CHECK(fill_ids(st, 0, 2) && seal_once(st, &sealed, NULL) && sealed,
                  "the replaced store works");
            struct stat sb;
            char p[160];
            snprintf(p, sizeof p, "/dev/shm%s", sn);
            CHECK(stat(p, &sb) == 0 && sb.st_size != sizes[k], "segment was not replaced");
        }
        wh_store_destroy(st);
        clean_store(&c);
    }
}

/* A creator names its segment only once it holds the header's pages: a
 * segment of 0 bytes was cut, not half-made, and is refused at once,
 * naming the truncation, rather than waited for and removed. */
static void t_empty_segment_was_cut(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 2, 64 << 10, &s);
    char sn[128], p[160];
    seg_name(c.uri, sn, sizeof sn);
    snprintf(p, sizeof p, "/dev/shm%s", sn);
    int fd = shm_open(sn, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0, "shm_open: %s", strerror(errno));
    if (fd < 0) return;
    close(fd);
    wh_err_t e;
    uint64_t t0 = wh_now_mono_ns();
    wh_store_t *st = wh_store_open(&c, &e);
    CHECK(!st && e.code == WH_E_CORRUPT && strstr(e.message, "is 0 bytes") &&
              strstr(e.message, "truncated"),
          "open over an empty segment: %s", st ? "opened" : e.message);
    CHECK(secs_since(t0) < 1.0, "took %.1f s", secs_since(t0));
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && sb.st_size == 0, "the cut segment was removed or replaced");
    wh_store_destroy(st);
    clean_store(&c);
}

static void t_too_big_for_shm(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 4, 1ull << 44, &s);
    wh_err_t e;
    uint64_t t0 = wh_now_mono_ns();
    wh_store_t *st = wh_store_open(&c, &e);
    CHECK(!st, "a 48 TiB store was created");
    CHECK(!st && e.code == WH_E_NOSPACE, "code %d, want WH_E_NOSPACE (%s)", e.code, e.message);
    CHECK(!st && strstr(e.message, "BYTE_BUDGET") && strstr(e.message, "/dev/shm"),
          "message should name BYTE_BUDGET and /dev/shm: %s", e.message);
    CHECK(secs_since(t0) < 10.0, "failing took %.1f s", secs_since(t0));
    CHECK(!seg_exists(c.uri), "a failed creation left its segment behind");
    wh_store_destroy(st);
    clean_store(&c);
}

/* Generation ids keep increasing when a store is removed and made again.
 * Each round seals max_seals times (SWAP_CAP 1, 1-byte samples), or until
 * it has made more generations than microseconds have passed since it was
 * opened, or for 300 ms, then removes the store; the next store must start
 * above the last id handed out. The default run makes 20 seals a round;
 * the stress case (run by name only: its outcome depends on whether this
 * machine seals faster than one generation per microsecond) seals as fast
 * as it can. */
static void gen_ids_rounds(long max_seals) {
    static const char *const names[] = {"x"};
    wh_schema_t s = schema_of(1, names);
    wh_store_config_t c = mkcfg(new_uri(), 1, 4096, &s);
    wh_err_t e;
    uint8_t v = 1;
    wh_array_t a = arr0(WH_DT_U8, &v);
    uint64_t last = 0;
    long seals = 0;
    double round_s = 0;
    for (int round = 0; round < 3; round++) {
        uint64_t t0 = wh_now_mono_ns();
        wh_store_t *st = wh_store_open(&c, &e);
        REQUIRE(st, "open: %s", e.message);
        wh_status_t s0 = status_of(st);
        CHECK(s0.write_gen > last,
              "round %d: new store starts at generation %llu, not above %llu "
              "(previous round: %ld seals in %.3f ms)",
              round, (unsigned long long)s0.write_gen, (unsigned long long)last, seals,
              round_s * 1e3);
        bool lead, sealed;
        CHECK(wh_store_lead(st, &lead, &e) && lead, "lead");
        seals = 0;
        for (;;) {
            double el = secs_since(t0);
            if (seals >= max_seals || el > 0.3 || (double)seals > el * 1e6 + 50) break;
            wh_put_status_t ps;
            uint64_t g;
            if (!wh_store_put(st, &a, 1, 100, &ps, NULL, &e) || !seal_once(st, &sealed, &g) ||
                !sealed) {
                CHECK(false, "put/seal %ld: %s", seals, e.message);
                break;
            }
            CHECK(g > last, "generation %llu after %llu", (unsigned long long)g,
                  (unsigned long long)last);
            last = g;
            seals++;
        }
        round_s = secs_since(t0);
        wh_store_destroy(st);
        clean_store(&c);
    }
out:
    clean_store(&c);
}

static void t_gen_ids_survive_recreate(void) { gen_ids_rounds(20); }
static void t_gen_ids_fast_seals(void) { gen_ids_rounds(10 * 1000 * 1000); }

/* ---- concurrency: 3 writers, a manager and a reader -------------------- */

#define MT_CAP 16
#define MT_MAX_IDS (1 << 16)
#define MT_WRITERS 3
#define MT_PHASE1_SWAPS 20
#define MT_PHASE2_SWAPS 300

typedef struct {
    wh_store_config_t cfg;
    int stop;                       /* atomic */
    int phase;                      /* atomic: 1 manager waits for the reader, 2 free */
    int failed;                     /* atomic */
    uint64_t reader_done;           /* atomic: last generation the reader read fully */
    uint8_t put_status[MT_MAX_IDS]; /* 1 accepted, 2 discarded */
    uint64_t put_gen[MT_MAX_IDS];
    uint64_t seen_gen[MT_MAX_IDS]; /* reader: generation an id was read in */
    uint64_t accepted[MT_WRITERS], discarded[MT_WRITERS], waits[MT_WRITERS];
    uint64_t sealed_gens[MT_PHASE1_SWAPS + MT_PHASE2_SWAPS];
    int nseals;
    int full_gens, gone, reads, gens_seen;
    char why[512];
} mt_t;

static void mt_fail(mt_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mt_fail(mt_t *t, const char *fmt, ...) {
    if (__atomic_exchange_n(&t->failed, 1, __ATOMIC_ACQ_REL) == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->why, sizeof t->why, fmt, ap);
        va_end(ap);
    }
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
}

static bool mt_stopped(mt_t *t) { return __atomic_load_n(&t->stop, __ATOMIC_ACQUIRE); }

typedef struct {
    mt_t *t;
    int w;
} mt_arg_t;

static void *mt_writer(void *p) {
    mt_arg_t *arg = p;
    mt_t *t = arg->t;
    int w = arg->w;
    wh_err_t e;
    wh_store_t *st = wh_store_open(&t->cfg, &e);
    if (!st) {
        mt_fail(t, "writer %d open: %s", w, e.message);
        return NULL;
    }
    /* writer w owns ids w, w+3, ...; an id is used again after a discard */
    uint64_t id = (uint64_t)w;
    int32_t buf[600];
    while (!mt_stopped(t)) {
        if (id >= MT_MAX_IDS) {
            mt_fail(t, "writer %d ran out of ids", w);
            break;
        }
        wh_array_t a[2];
        make_id_sample(id, buf, (id / 3) & 1, a);
        wh_put_status_t ps;
        uint64_t g = 0;
        if (!wh_store_put(st, a, 2, 20, &ps, &g, &e)) {
            mt_fail(t, "writer %d put id %llu: %s", w, (unsigned long long)id, e.message);
            break;
        }
        if (ps == WH_PUT_ACCEPTED) {
            __atomic_store_n(&t->put_gen[id], g, __ATOMIC_RELAXED);
            __atomic_store_n(&t->put_status[id], 1, __ATOMIC_RELEASE);
            t->accepted[w]++;
            id += MT_WRITERS;
        } else if (ps == WH_PUT_DISCARDED) {
            t->discarded[w]++;
            sched_yield(); /* the generation is full: let the manager seal */
        } else {
            t->waits[w]++;
        }
    }
    wh_store_destroy(st);
    return NULL;
}

static void *mt_manager(void *p) {
    mt_t *t = p;
    wh_err_t e;
    wh_store_t *st = wh_store_open(&t->cfg, &e);
    bool lead = false;
    if (!st || !wh_store_lead(st, &lead, &e) || !lead) {
        mt_fail(t, "manager open/lead: %s", st ? e.message : "open failed");
        wh_store_destroy(st);
        return NULL;
    }
    uint64_t t0 = wh_now_mono_ns();
    while (!mt_stopped(t)) {
        if (secs_since(t0) > 90) {
            mt_fail(t, "manager: only %d seals in 90 s (reader read %d generations fully)",
                    t->nseals, __atomic_load_n(&t->full_gens, __ATOMIC_RELAXED));
            break;
        }
        bool sealed = false;
        wh_seal_info_t info;
        if (!wh_store_lead(st, &lead, &e) || !lead) {
            mt_fail(t, "manager lost the lease: %s", e.message);
            break;
        }
        if (!wh_store_seal(st, &sealed, &info, &e)) {
            mt_fail(t, "seal: %s", e.message);
            break;
        }
        if (!sealed) {
            sched_yield();
            continue;
        }
        if (t->nseals && info.generation != t->sealed_gens[t->nseals - 1] + 1)
            mt_fail(t, "sealed generation %llu after %llu", (unsigned long long)info.generation,
                    (unsigned long long)t->sealed_gens[t->nseals - 1]);
        t->sealed_gens[t->nseals++] = info.generation;
        if (t->nseals == MT_PHASE1_SWAPS) __atomic_store_n(&t->phase, 2, __ATOMIC_RELEASE);
        if (t->nseals >= MT_PHASE1_SWAPS + MT_PHASE2_SWAPS) break;
        if (t->nseals < MT_PHASE1_SWAPS) {
            /* phase 1: the next seal waits until the reader has read this
             * generation through, so every generation is verified whole */
            while (!mt_stopped(t) &&
                   __atomic_load_n(&t->reader_done, __ATOMIC_ACQUIRE) < info.generation) {
                if (secs_since(t0) > 90) {
                    mt_fail(t, "reader never finished generation %llu",
                            (unsigned long long)info.generation);
                    break;
                }
                sched_yield();
            }
        }
    }
    wh_store_resign(st, &e);
    wh_store_destroy(st);
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *mt_reader(void *p) {
    mt_t *t = p;
    wh_err_t e;
    wh_store_t *st = wh_store_open(&t->cfg, &e);
    if (!st) {
        mt_fail(t, "reader open: %s", e.message);
        return NULL;
    }
    id_reader_t r;
    id_reader_init(&r);
    uint64_t last_cur = 0, last_read = 0;
    while (!mt_stopped(t)) {
        uint64_t g = 0;
        wh_store_current(st, &g, &e);
        if (g < last_cur) {
            mt_fail(t, "current generation went back from %llu to %llu",
                    (unsigned long long)last_cur, (unsigned long long)g);
            break;
        }
        last_cur = g;
        if (g == 0 || g == last_read) {
            sched_yield();
            continue;
        }
        if (g < last_read) {
            mt_fail(t, "reader: generation %llu after %llu", (unsigned long long)g,
                    (unsigned long long)last_read);
            break;
        }
        last_read = g;
        t->gens_seen++;
        static uint8_t in_gen[MT_MAX_IDS];
        memset(in_gen, 0, sizeof in_gen);
        bool whole = true;
        for (uint32_t pos = 0; pos < MT_CAP && !mt_stopped(t); pos++) {
            wh_sample_meta_t m;
            r.id = -1;
            if (!wh_store_read(st, g, pos, dest_cb, &r.d, &m, &e)) {
                if (e.code == WH_E_GONE) { /* lost a race with reclamation: move on */
                    t->gone++;
                    whole = false;
                    break;
                }
                mt_fail(t, "read gen %llu pos %u: code %d %s", (unsigned long long)g, pos, e.code,
                        e.message);
                break;
            }
            t->reads++;
            char why[256];
            if (!id_sample_ok(&r, &m, why, sizeof why)) {
                mt_fail(t, "gen %llu pos %u: %s", (unsigned long long)g, pos, why);
                break;
            }
            uint64_t id = (uint64_t)r.id;
            if (id >= MT_MAX_IDS || in_gen[id]) {
                mt_fail(t, "gen %llu: id %llu at two positions", (unsigned long long)g,
                        (unsigned long long)id);
                break;
            }
            in_gen[id] = 1;
            uint64_t prev = t->seen_gen[id];
            if (prev && prev != g) {
                mt_fail(t, "id %llu in generations %llu and %llu", (unsigned long long)id,
                        (unsigned long long)prev, (unsigned long long)g);
                break;
            }
            t->seen_gen[id] = g;
        }
        if (whole && !mt_stopped(t)) {
            t->full_gens++;
            __atomic_store_n(&t->reader_done, g, __ATOMIC_RELEASE);
        }
    }
    wh_store_destroy(st);
    return NULL;
}

static void t_concurrent(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    mt_t *t = calloc(1, sizeof *t);
    if (!t) return;
    /* every sample is at most 320 + 2028 bytes: 16 of them fit 64 KiB */
    t->cfg = mkcfg(new_uri(), MT_CAP, 64 << 10, &s);
    t->phase = 1;
    wh_err_t e;
    wh_store_t *st = wh_store_open(&t->cfg, &e);
    REQUIRE(st, "open: %s", e.message);
    pthread_t wt[MT_WRITERS], mt, rt;
    mt_arg_t args[MT_WRITERS];
    pthread_create(&rt, NULL, mt_reader, t);
    for (int w = 0; w < MT_WRITERS; w++) {
        args[w] = (mt_arg_t){t, w};
        pthread_create(&wt[w], NULL, mt_writer, &args[w]);
    }
    pthread_create(&mt, NULL, mt_manager, t);
    pthread_join(mt, NULL);
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    for (int w = 0; w < MT_WRITERS; w++) pthread_join(wt[w], NULL);
    pthread_join(rt, NULL);

    CHECK(!t->failed, "%s", t->why);
    CHECK(t->nseals == MT_PHASE1_SWAPS + MT_PHASE2_SWAPS, "%d seals", t->nseals);
    CHECK(t->full_gens >= MT_PHASE1_SWAPS, "reader read only %d generations whole", t->full_gens);
    wh_status_t fin = status_of(st);
    uint64_t acc = 0, dis = 0, waits = 0;
    for (int w = 0; w < MT_WRITERS; w++) {
        acc += t->accepted[w];
        dis += t->discarded[w];
        waits += t->waits[w];
    }
    /* exact generations: every accepted put is in exactly one generation */
    CHECK(fin.generated == acc, "store counted %llu accepted, writers %llu",
          (unsigned long long)fin.generated, (unsigned long long)acc);
    CHECK(fin.discarded == dis, "store counted %llu discarded, writers %llu",
          (unsigned long long)fin.discarded, (unsigned long long)dis);
    CHECK(fin.generated == (uint64_t)t->nseals * MT_CAP + fin.write_fill,
          "generated %llu != %d seals x %d + fill %u", (unsigned long long)fin.generated, t->nseals,
          MT_CAP, fin.write_fill);
    int seen = 0, bad = 0;
    for (uint64_t id = 0; id < MT_MAX_IDS; id++) {
        if (!t->seen_gen[id]) continue;
        seen++;
        if (t->put_status[id] != 1 || t->put_gen[id] != t->seen_gen[id]) {
            if (bad++ < 3)
                CHECK(false, "id %llu read in generation %llu but put status %d into %llu",
                      (unsigned long long)id, (unsigned long long)t->seen_gen[id],
                      t->put_status[id], (unsigned long long)t->put_gen[id]);
        }
    }
    CHECK(bad == 0, "%d ids read where they were not put", bad);
    fprintf(stderr,
            "     concurrent: %d seals, reader saw %d generations (%d whole, %d gone), "
            "%d reads, %d distinct ids; writers: %llu accepted, %llu discarded, %llu waits\n",
            t->nseals, t->gens_seen, t->full_gens, t->gone, t->reads, seen, (unsigned long long)acc,
            (unsigned long long)dis, (unsigned long long)waits);
out:
    wh_store_destroy(st);
    clean_store(&t->cfg);
    free(t);
}

/* ---- main -------------------------------------------------------------- */

/* Parameters on shm (wh_params.c): versions, the bound, damage to the side
 * file read back as an error, a dead setter's lock taken over. The file's
 * layout, as wh_params.c lays it out: magic, owner pid (+4 pad), version,
 * then two slots of {seq, version, len, sum, data[WH_PARAMS_MAX]}. */
#define PF_OWNER 8
#define PF_SLOT(i) (24 + (size_t)(i) * (32 + WH_PARAMS_MAX))
static void t_params(void) {
    static const char *const names[] = {"x"};
    wh_schema_t s;
    wh_err_t e;
    wh_store_t *st = NULL;
    int fd = -1;
    unsigned char *m = MAP_FAILED;
    const size_t flen = PF_SLOT(2);
    char path[160];
    REQUIRE(wh_schema_init(&s, 1, names, &e), "schema");
    wh_store_config_t c = mkcfg(new_uri(), 2, 1 << 16, &s);
    snprintf(path, sizeof path, "/dev/shm/wirehead-params.%s", c.uri + strlen("shm://"));
    st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    uint64_t v = 9;
    char *doc = NULL;
    size_t len = 0;
    CHECK(wh_store_params_get(st, &v, &doc, &len, &e) && v == 0 && len == 2 &&
              strcmp(doc, "{}") == 0,
          "never set: version 0, {}");
    free(doc);
    CHECK(wh_store_params_set(st, "{\"a\":1}", 7, &v, &e) && v == 1, "first set: %s", e.message);
    CHECK(wh_store_params_set(st, "{\"a\":2}", 7, &v, &e) && v == 2, "second set");
    CHECK(wh_store_params_version(st, &v, &e) && v == 2, "version");
    static char big[WH_PARAMS_MAX + 1];
    memset(big, '1', sizeof big);
    CHECK(!wh_store_params_set(st, big, sizeof big, &v, &e) && e.code == WH_E_TOOBIG &&
              strstr(e.message, "65537 bytes"),
          "too big: %s", e.message);
    CHECK(wh_store_params_set(st, big, WH_PARAMS_MAX, &v, &e) && v == 3, "exactly the bound");
    CHECK(wh_store_params_get(st, &v, &doc, &len, &e) && v == 3 && len == WH_PARAMS_MAX &&
              memcmp(doc, big, len) == 0,
          "the bound read back");
    free(doc);

    fd = open(path, O_RDWR);
    REQUIRE(fd >= 0, "open %s", path);
    m = mmap(NULL, flen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED, "mmap");
    /* version 3 lives in slot 1: a forged length, then a flipped byte */
    uint64_t keep, forged = 1ull << 40;
    memcpy(&keep, m + PF_SLOT(1) + 16, 8);
    memcpy(m + PF_SLOT(1) + 16, &forged, 8);
    CHECK(!wh_store_params_get(st, &v, &doc, &len, &e) && e.code == WH_E_CORRUPT,
          "forged length: %s", e.message);
    memcpy(m + PF_SLOT(1) + 16, &keep, 8);
    m[PF_SLOT(1) + 32 + 100] ^= 1;
    CHECK(!wh_store_params_get(st, &v, &doc, &len, &e) && e.code == WH_E_CORRUPT,
          "flipped byte: %s", e.message);
    m[PF_SLOT(1) + 32 + 100] ^= 1;
    /* a setter that died holding the lock: taken over at once */
    pid_t kid = fork();
    if (kid == 0) _exit(0);
    waitpid(kid, NULL, 0);
    int32_t dead = (int32_t)kid;
    memcpy(m + PF_OWNER, &dead, 4);
    uint64_t t0 = wh_now_mono_ns();
    CHECK(wh_store_params_set(st, "{}", 2, &v, &e) && v == 4, "after a dead holder: %s", e.message);
    CHECK(wh_now_mono_ns() - t0 < 1000000000ull, "taken over at once");
    /* clean removes the side file */
    clean_store(&c);
    CHECK(access(path, F_OK) != 0, "clean removes %s", path);
out:
    if (m != MAP_FAILED) munmap(m, flen);
    if (fd >= 0) close(fd);
    wh_store_destroy(st);
}

/* The DataLoader workers' ring (wh_ring.c) without Python: one region
 * lock, a slot taken, handed over with every row checked, given back by its
 * last reference, grown to a new file version, reclaimed from a worker that
 * is gone (its late handle refused), and a truncated slot an error naming
 * it. The worker and the main process are one process here: its pid plays
 * both, and a made-up main pid lets a new worker reclaim. */
static void ring_unlink(const char *path) {
    char p[256];
    unlink(path);
    for (int j = 0; j < 2; j++)
        for (int v = 1; v < 5; v++) {
            snprintf(p, sizeof p, "%s.s%d.v%d", path, j, v);
            unlink(p);
        }
}

/* A worker's hand-made fill: size bytes of val in slot *j, sealed with a
 * row (all but the last 8 bytes) and the "extras" (those 8), *sum for the
 * handle. */
static bool ring_made(wh_ring_t *w, uint64_t size, int val, int *j, void **data, uint64_t *sum,
                      wh_err_t *e) {
    if (!wh_ring_acquire(w, wh_ring_bytes(size, 2), 0, j, data, e) || *j < 0) return false;
    memset(*data, val, size);
    wh_ring_check_t ck[2] = {{0, size - 8, XXH3_64bits(*data, size - 8)},
                             {size - 8, 8, XXH3_64bits((char *)*data + size - 8, 8)}};
    return wh_ring_seal(w, *j, size, ck, 2, sum, e);
}

static void t_ring(void) {
    char path[128], spath[256];
    snprintf(path, sizeof path, "/dev/shm/whctest-ring-%d", (int)getpid());
    ring_unlink(path);
    int64_t me = getpid(), owner = -1, ver = 0, seq = 0, v2 = 0, s2 = 0;
    uint64_t sum = 0;
    wh_err_t e = {0};
    bool busy = false;
    wh_buf_t *held = NULL;
    wh_ring_t *w = wh_ring_open(path, "0", 2, true, me, &busy, &e), *m = NULL, *w2 = NULL;
    REQUIRE(w, "worker open: %s", e.message);
    w2 = wh_ring_open(path, "0", 2, true, me, &busy, &e);
    CHECK(!w2 && busy, "a second worker took a region whose lock is held");
    int j = -1;
    void *data = NULL;
    REQUIRE(ring_made(w, 100, 7, &j, &data, &sum, &e) && j == 0, "fill: %s", e.message);
    REQUIRE(wh_ring_stamp(w, j, &ver, &seq, &e), "stamp: %s", e.message);
    CHECK(ver == 1 && seq == 1, "first fill: version %lld sequence %lld", (long long)ver,
          (long long)seq);
    m = wh_ring_open(path, "0", 2, false, me, NULL, &e);
    REQUIRE(m, "main open: %s", e.message);
    CHECK(!wh_ring_claim(m, j, ver, seq + 1, me, 100, sum, 2, WH_RING_CHECK_SLOT, &held, &e) &&
              e.code == WH_E_GONE && strstr(e.message, "reclaimed"),
          "a stale sequence claimed: %s", e.message);
    /* garbage in a row after the fill: the full check finds it */
    ((char *)data)[5] = 8;
    CHECK(!wh_ring_claim(m, j, ver, seq, me, 100, sum, 2, WH_RING_CHECK_ROWS, &held, &e) &&
              e.code == WH_E_CORRUPT && strstr(e.message, path) && strstr(e.message, "XXH3"),
          "changed bytes claimed: %s", e.message);
    CHECK(wh_ring_word(w, j, WH_RING_OWNER, &owner, &e) && owner == 0,
          "a refused slot is not back with its worker: owner %lld", (long long)owner);
    /* a damaged row table, header, or a handle whose seal is not the slot's:
     * the default check finds each */
    for (int k = 0; k < 4; k++) {
        REQUIRE(ring_made(w, 100, 9, &j, &data, &sum, &e) && j == 0, "fill: %s", e.message);
        REQUIRE(wh_ring_stamp(w, j, &ver, &seq, &e), "stamp: %s", e.message);
        char *seal = (char *)data + WH_ALIGN_UP(100);
        uint64_t hsum = sum, rows = 2;
        if (k == 0) seal[8 * WH_RING_SEAL_WORDS + 16] ^= 1; /* the row's stored XXH3 */
        if (k == 1) seal[8] ^= 1;                           /* the worker's pid */
        if (k == 2) hsum ^= 1;
        if (k == 3) rows = 3;
        CHECK(!wh_ring_claim(m, j, ver, seq, me, 100, hsum, rows, WH_RING_CHECK_SLOT, &held, &e) &&
                  e.code == WH_E_CORRUPT && strstr(e.message, path) &&
                  strstr(e.message, "does not hold the batch"),
              "damaged seal %d claimed: %s", k, e.message);
    }
    /* a row changed after the fill is the full check's: the default reads no row */
    REQUIRE(ring_made(w, 100, 9, &j, &data, &sum, &e) && j == 0, "fill: %s", e.message);
    REQUIRE(wh_ring_stamp(w, j, &ver, &seq, &e), "stamp: %s", e.message);
    ((char *)data)[5] = 8;
    REQUIRE(wh_ring_claim(m, j, ver, seq, me, 100, sum, 2, WH_RING_CHECK_SLOT, &held, &e),
            "claim: %s", e.message);
    wh_buf_unref(held);
    held = NULL;
    REQUIRE(ring_made(w, 100, 9, &j, &data, &sum, &e) && j == 0, "fill: %s", e.message);
    REQUIRE(wh_ring_stamp(w, j, &ver, &seq, &e), "stamp: %s", e.message);
    REQUIRE(wh_ring_claim(m, j, ver, seq, me, 100, sum, 2, WH_RING_CHECK_ROWS, &held, &e),
            "claim: %s", e.message);
    CHECK(held->size == 100 && ((char *)held->data)[99] == 9, "the claimed slot's bytes");
    wh_ring_close(m); /* a batch still out keeps what it needs */
    m = NULL;
    int k = -1;
    CHECK(wh_ring_acquire(w, 100, 0, &k, &data, &e) && k == 1, "a held slot taken again: %d", k);
    wh_ring_give_back(w, 1);
    wh_buf_unref(held);
    held = NULL;
    CHECK(wh_ring_word(w, 0, WH_RING_OWNER, &owner, &e) && owner == 0,
          "the last reference did not hand the slot back: owner %lld", (long long)owner);
    /* grown: a new file version, page-rounded; the old file gone */
    REQUIRE(wh_ring_acquire(w, 10000, 0, &j, &data, &e) && j == 0, "grow: %s", e.message);
    REQUIRE(wh_ring_stamp(w, j, &v2, &s2, &e), "stamp: %s", e.message);
    CHECK(v2 == 2 && wh_ring_word(w, j, WH_RING_CAP, &owner, &e) && owner % 4096 == 0 &&
              owner >= 10000,
          "grown slot: version %lld capacity %lld", (long long)v2, (long long)owner);
    snprintf(spath, sizeof spath, "%s.s0.v1", path);
    CHECK(access(spath, F_OK) != 0, "the slot's old file is left");
    /* the worker goes; the next one (main pid made up) reclaims its slot */
    wh_ring_close(w);
    w = wh_ring_open(path, "0", 2, true, me + 1000000, &busy, &e);
    REQUIRE(w, "second worker open: %s", e.message);
    CHECK(wh_ring_word(w, 0, WH_RING_OWNER, &owner, &e) && owner == 0,
          "a gone worker's slot not reclaimed: owner %lld", (long long)owner);
    m = wh_ring_open(path, "0", 2, false, me, NULL, &e);
    REQUIRE(m, "main open: %s", e.message);
    CHECK(!wh_ring_claim(m, 0, v2, s2, me, 100, sum, 2, WH_RING_CHECK_SLOT, &held, &e) &&
              e.code == WH_E_GONE,
          "a reclaimed slot's late handle claimed");
    /* truncated under us: an error naming the file, not a SIGBUS */
    snprintf(spath, sizeof spath, "%s.s0.v2", path);
    REQUIRE(truncate(spath, 0) == 0, "truncate: %s", strerror(errno));
    uint64_t h = 0;
    CHECK(!wh_ring_hash(w, 0, 0, 100, &h, &e) && strstr(e.message, spath) &&
              strstr(e.message, "holds 0 bytes"),
          "a truncated slot hashed: %s", e.message);
out:
    wh_buf_unref(held);
    wh_ring_close(w2);
    wh_ring_close(m);
    wh_ring_close(w);
    ring_unlink(path);
}

/* A full hand-over check of many large rows is spread over several
 * threads: every row still counts, so one changed byte in the last row
 * refuses the batch; a row table reaching past the batch is refused by the
 * seal's check. */
static void t_ring_rows(void) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/whctest-ringrows-%d", (int)getpid());
    ring_unlink(path);
    enum {
        ROWS = 6,
        ROW = 4 << 20
    };
    const uint64_t size = (uint64_t)ROWS * ROW;
    int64_t me = getpid(), ver = 0, seq = 0;
    uint64_t sum = 0;
    wh_err_t e = {0};
    bool busy = false;
    wh_buf_t *held = NULL;
    wh_ring_check_t ck[ROWS];
    wh_ring_t *w = wh_ring_open(path, "0", 1, true, me, &busy, &e), *m = NULL;
    REQUIRE(w, "worker open: %s", e.message);
    m = wh_ring_open(path, "0", 1, false, me, NULL, &e);
    REQUIRE(m, "main open: %s", e.message);
    for (int round = 0; round < 3; round++) {
        int j = -1;
        void *data = NULL;
        REQUIRE(wh_ring_acquire(w, wh_ring_bytes(size, ROWS), 0, &j, &data, &e), "acquire: %s",
                e.message);
        for (int r = 0; r < ROWS; r++) {
            memset((char *)data + (size_t)r * ROW, r + round, ROW);
            ck[r] = (wh_ring_check_t){(uint64_t)r * ROW, ROW,
                                      XXH3_64bits((char *)data + (size_t)r * ROW, ROW)};
        }
        if (round == 2) ck[2].off = (uint64_t)1 << 40; /* past the slot's end */
        REQUIRE(wh_ring_seal(w, j, size, ck, ROWS, &sum, &e), "seal: %s", e.message);
        REQUIRE(wh_ring_stamp(w, j, &ver, &seq, &e), "stamp: %s", e.message);
        if (round == 0) {
            REQUIRE(
                wh_ring_claim(m, j, ver, seq, me, size, sum, ROWS, WH_RING_CHECK_ROWS, &held, &e),
                "claim: %s", e.message);
            wh_buf_unref(held);
            held = NULL;
        } else if (round == 1) {
            ((char *)data)[size - 1] ^= 1; /* the last byte of the last row */
            CHECK(!wh_ring_claim(m, j, ver, seq, me, size, sum, ROWS, WH_RING_CHECK_ROWS, &held,
                                 &e) &&
                      e.code == WH_E_CORRUPT && strstr(e.message, "XXH3"),
                  "a changed last row claimed: %s", e.message);
        } else {
            CHECK(!wh_ring_claim(m, j, ver, seq, me, size, sum, ROWS, WH_RING_CHECK_SLOT, &held,
                                 &e) &&
                      strstr(e.message, "reaches past the batch"),
                  "a check past the slot claimed: %s", e.message);
        }
    }
out:
    wh_buf_unref(held);
    wh_ring_close(m);
    wh_ring_close(w);
    ring_unlink(path);
}

/* A worker's fill of a ring slot (wh_ring_fill over wh_batch_fill) from a
 * real store: rows, extras, the stored checksums handed over, pad='ignore'
 * written with its checks anew, a row of another shape named, and heap
 * memory when the one slot is held. */
typedef struct {
    const uint32_t *pos;
    const bool *pad;
} ring_at_t;

static void ring_at(void *ctx, uint32_t i, uint32_t *pos, bool *pad) {
    const ring_at_t *a = ctx;
    *pos = a->pos[i];
    *pad = a->pad[i];
}

/* ids 0, 500 and 1000 hold 8 int32 of data, id 1 holds 9 */
static const uint64_t ring_ids[4] = {0, 500, 1000, 1};

/* A store of c with one generation of ring_ids, and a worker's ring of one
 * slot at path: *st, *r and *gen, or false with e set. */
static bool ring_fill_setup(wh_store_config_t *c, const char *path, wh_store_t **st, wh_ring_t **r,
                            uint64_t *gen, wh_err_t *e) {
    bool lead, sealed, busy;
    ring_unlink(path);
    if (!(*st = wh_store_open(c, e)) || !wh_store_lead(*st, &lead, e)) return false;
    for (int i = 0; i < 4; i++)
        if (!fill_ids(*st, ring_ids[i], 1)) return wh_err_set(e, WH_E_INTERNAL, "put %d", i);
    if (!seal_once(*st, &sealed, gen) || !sealed) return wh_err_set(e, WH_E_INTERNAL, "seal");
    *r = wh_ring_open(path, "0", 1, true, (int64_t)getpid(), &busy, e);
    return *r != NULL;
}

static void t_ring_fill(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 4, 64 << 10, &s);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/whctest-ringfill-%d", (int)getpid());
    wh_err_t e = {0};
    wh_ring_t *r = NULL;
    wh_store_t *st = NULL;
    wh_buf_t *held = NULL, *heap = NULL;
    bool rf = false;
    uint64_t gen = 0;
    const uint64_t *ids = ring_ids;
    REQUIRE(ring_fill_setup(&c, path, &st, &r, &gen, &e), "set-up: %s", e.message);
    uint32_t pos[3] = {0, 1, 2};
    bool pad[3] = {false, false, true};
    ring_at_t at = {pos, pad};
    uint64_t sums[3 * WH_MAX_FIELDS];
    wh_batch_fill_t rq = {.st = st,
                          .schema = &c.schema,
                          .n = 3,
                          .want = 3,
                          .timeout_s = 5,
                          .at = ring_at,
                          .at_ctx = &at,
                          .sums = sums,
                          .ignore_fields = 2,
                          .ignore_int = -100,
                          .ignore_float = -100};
    wh_batch_t b;
    wh_batch_stats_t bs;
    void *data = NULL;
    int slot = -1;
    uint64_t seal = 0;
    REQUIRE(wh_ring_fill(r, &rq, gen, 0, &slot, &heap, &b, &data, &seal, &bs, &rf, &e) &&
                slot == 0 && !heap,
            "fill: %s", e.message);
    const char *base = data;
    wh_ring_check_t ck[6];
    for (uint32_t i = 0; i < 3; i++) {
        int64_t g, p, id;
        memcpy(&g, base + b.gen_off + 8 * i, 8);
        memcpy(&p, base + b.pos_off + 8 * i, 8);
        memcpy(&id, base + b.off[0] + 8 * i, 8);
        CHECK(g == (int64_t)gen && p == pos[i] && base[b.pad_off + i] == pad[i] &&
                  id == (int64_t)ids[i],
              "row %u: generation %lld position %lld pad %d id %lld", i, (long long)g, (long long)p,
              base[b.pad_off + i], (long long)id);
        const int32_t *d = (const int32_t *)(base + b.off[1] + (uint64_t)i * b.meta[1].nbytes);
        for (int k = 0; k < 8; k++)
            CHECK(d[k] == (pad[i] ? -100 : data_val(ids[i], k)), "row %u data %d: %d", i, k, d[k]);
        for (int f = 0; f < 2; f++) {
            uint64_t off = b.off[f] + (uint64_t)i * b.meta[f].nbytes;
            CHECK(sums[i * WH_MAX_FIELDS + f] == XXH3_64bits(base + off, b.meta[f].nbytes),
                  "row %u field %d: its sum is not its bytes' XXH3", i, f);
            ck[f * 3 + i] = (wh_ring_check_t){off, b.meta[f].nbytes, sums[i * WH_MAX_FIELDS + f]};
        }
    }
    int64_t ver, seq;
    REQUIRE(wh_ring_stamp(r, 0, &ver, &seq, &e), "stamp: %s", e.message);
    /* the seal holds those checks, then the extras' */
    const wh_ring_check_t *table =
        (const wh_ring_check_t *)(base + WH_ALIGN_UP(b.size) + 8 * WH_RING_SEAL_WORDS);
    CHECK(memcmp(table, ck, sizeof ck) == 0 && table[6].off == b.pad_off &&
              table[6].hash == XXH3_64bits(base + b.pad_off, b.size - b.pad_off),
          "the seal's row table");
    REQUIRE(wh_ring_claim(r, 0, ver, seq, (int64_t)getpid(), b.size, seal, 7, WH_RING_CHECK_ROWS,
                          &held, &e),
            "claim: %s", e.message);
    /* the one slot is held: heap memory */
    REQUIRE(wh_ring_fill(r, &rq, gen, 0, &slot, &heap, &b, &data, &seal, &bs, &rf, &e) &&
                slot == -1 && heap && data == heap->data,
            "fill with every slot held: %s", e.message);
    wh_buf_unref(heap);
    heap = NULL;
    wh_buf_unref(held);
    held = NULL;
    pos[1] = 3; /* id 1: 9 int32, not 8 */
    CHECK(!wh_ring_fill(r, &rq, gen, 0, &slot, &heap, &b, &data, &seal, &bs, &rf, &e) &&
              bs.mismatch && bs.mismatch_pos == 3 && !rf && strstr(e.message, "field 'data'") &&
              slot == -1,
          "a row of another shape: %s", e.message);
    int64_t owner = -1;
    CHECK(wh_ring_word(r, 0, WH_RING_OWNER, &owner, &e) && owner == 0,
          "a failed fill kept its slot: owner %lld", (long long)owner);
out:
    wh_buf_unref(held);
    wh_buf_unref(heap);
    wh_ring_close(r);
    ring_unlink(path);
    wh_store_destroy(st);
    clean_store(&c);
}

/* The hand-over of positions: a fill with direct_min leaves the rows of
 * large fields in the store (the slot holds the rest, sealed over it),
 * hands over every field's stored checksum, keeps no pin once it returns,
 * and gathers the whole batch into heap memory when no slot is free. */
static void t_ring_fill_direct(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    wh_store_config_t c = mkcfg(new_uri(), 4, 64 << 10, &s);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/whctest-ringdirect-%d", (int)getpid());
    wh_err_t e = {0};
    wh_ring_t *r = NULL;
    wh_store_t *st = NULL;
    wh_buf_t *held = NULL, *heap = NULL;
    bool rf = false;
    uint64_t gen = 0;
    const uint64_t *ids = ring_ids;
    REQUIRE(ring_fill_setup(&c, path, &st, &r, &gen, &e), "set-up: %s", e.message);
    uint32_t pos[3] = {0, 1, 2};
    bool pad[3] = {false, false, false};
    ring_at_t at = {pos, pad};
    uint64_t sums[3 * WH_MAX_FIELDS];
    /* data: 8 int32 (32 bytes) a row, left in the store; id (8 bytes) copied */
    wh_batch_fill_t rq = {.st = st,
                          .schema = &c.schema,
                          .n = 3,
                          .want = 3,
                          .timeout_s = 5,
                          .at = ring_at,
                          .at_ctx = &at,
                          .sums = sums,
                          .direct_min = 32};
    wh_batch_t b;
    wh_batch_stats_t bs;
    void *data = NULL;
    int slot = -1;
    uint64_t seal = 0;
    REQUIRE(wh_ring_fill(r, &rq, gen, 0, &slot, &heap, &b, &data, &seal, &bs, &rf, &e) &&
                slot == 0 && !heap,
            "fill: %s", e.message);
    CHECK(b.direct == 2 && b.hsize == b.size - WH_ALIGN_UP(3 * 32) && !b.views && !b.src,
          "data left in the store: direct %u, %llu of %llu bytes in the slot", b.direct,
          (unsigned long long)b.hsize, (unsigned long long)b.size);
    const char *base = data;
    wh_ring_check_t ck[3];
    for (uint32_t i = 0; i < 3; i++) {
        int64_t g, p, id;
        memcpy(&g, base + wh_batch_host_off(&b, b.gen_off) + 8 * i, 8);
        memcpy(&p, base + wh_batch_host_off(&b, b.pos_off) + 8 * i, 8);
        memcpy(&id, base + b.off[0] + 8 * i, 8);
        CHECK(g == (int64_t)gen && p == pos[i] && id == (int64_t)ids[i],
              "row %u: generation %lld position %lld id %lld", i, (long long)g, (long long)p,
              (long long)id);
        CHECK(sums[i * WH_MAX_FIELDS + 1] != 0, "row %u: the data's stored checksum", i);
        ck[i] = (wh_ring_check_t){b.off[0] + 8 * i, 8, sums[i * WH_MAX_FIELDS]};
    }
    /* the seal holds the id rows and the extras only */
    uint64_t pad_at = wh_batch_host_off(&b, b.pad_off);
    const wh_ring_check_t *table =
        (const wh_ring_check_t *)(base + WH_ALIGN_UP(b.hsize) + 8 * WH_RING_SEAL_WORDS);
    CHECK(memcmp(table, ck, sizeof ck) == 0 && table[3].off == pad_at &&
              table[3].hash == XXH3_64bits(base + pad_at, b.hsize - pad_at),
          "the seal's row table");
    /* the layout as it crosses to the main process: read back the same;
     * any word of its head, offsets or row sizes changed, cut short, or its
     * slot part another size than the slot's: refused */
    size_t wn = wh_batch_wire_size(&b);
    uint64_t *wire = malloc(wn);
    REQUIRE(wire, "out of memory");
    wh_batch_wire_write(&b, &rq, sums, wire);
    wh_batch_wire_t w;
    CHECK(wh_batch_wire_read(wire, wn, b.hsize, &w, &e) && w.b.direct == b.direct &&
              w.b.size == b.size && w.b.hsize == b.hsize && w.b.n == 3 && w.checks == 4 &&
              w.timeout_s == 5 && !w.strict && !memcmp(w.b.off, b.off, 2 * sizeof *b.off) &&
              !memcmp(w.sums + 8 * 2 + 8, &sums[WH_MAX_FIELDS + 1], 8),
          "read back: %s", e.message);
    for (size_t k = 0; k < 11 + 2 * (size_t)b.nfields; k++) {
        wire[k] ^= 64;
        CHECK(!wh_batch_wire_read(wire, wn, b.hsize, &w, &e) && strstr(e.message, "layout"),
              "word %zu changed: read as a layout", k);
        wire[k] ^= 64;
    }
    CHECK(!wh_batch_wire_read(wire, wn - 8, 0, &w, &e) && strstr(e.message, "is refused"),
          "cut short: read as a layout");
    CHECK(!wh_batch_wire_read(wire, wn, b.hsize + 64, &w, &e) &&
              strstr(e.message, "does not fit its"),
          "a slot of another size: %s", e.message);
    free(wire);
    wh_status_t stt;
    REQUIRE(wh_store_status(st, &stt, &e), "status: %s", e.message);
    for (int i = 0; i < stt.nareas; i++)
        CHECK(stt.areas[i].pins == 0, "area %d: %u pins left after the fill", i, stt.areas[i].pins);
    int64_t ver, seq;
    REQUIRE(wh_ring_stamp(r, 0, &ver, &seq, &e), "stamp: %s", e.message);
    REQUIRE(wh_ring_claim(r, 0, ver, seq, (int64_t)getpid(), b.hsize, seal, 4, WH_RING_CHECK_ROWS,
                          &held, &e),
            "claim: %s", e.message);
    /* the one slot is held: heap memory, the batch gathered whole */
    REQUIRE(wh_ring_fill(r, &rq, gen, 0, &slot, &heap, &b, &data, &seal, &bs, &rf, &e) &&
                slot == -1 && heap && data == heap->data && !b.direct && b.hsize == b.size,
            "fill with every slot held: %s", e.message);
    for (uint32_t i = 0; i < 3; i++) {
        const int32_t *d = (const int32_t *)((const char *)data + b.off[1] + 32 * (uint64_t)i);
        for (int k = 0; k < 8; k++)
            CHECK(d[k] == data_val(ids[i], k), "heap row %u data %d: %d", i, k, d[k]);
    }
out:
    wh_buf_unref(held);
    wh_buf_unref(heap);
    wh_ring_close(r);
    ring_unlink(path);
    wh_store_destroy(st);
    clean_store(&c);
}

/* ---- spec mode: a generator SIGKILLed at every step of its store writes ---- */

/* Claims and puts (sample index k as id k) until spec generation spec_gen
 * is sealed; at most max_claims claims. False (and why) on anything else. */
static bool spec_make(wh_store_t *st, uint64_t spec_gen, int max_claims, uint32_t *retried) {
    int32_t buf[600];
    wh_array_t a[2];
    for (int i = 0; i < max_claims; i++) {
        wh_err_t e;
        uint64_t gen = 0;
        if (!wh_store_spec_locate(st, spec_gen, &gen, &e)) {
            fprintf(stderr, "  locate %llu: %s\n", (unsigned long long)spec_gen, e.message);
            return false;
        }
        if (gen) return true;
        wh_claim_t c;
        wh_claim_status_t cs;
        if (!wh_store_spec_claim(st, 30.0, 3, &c, &cs, &e)) {
            fprintf(stderr, "  claim: %s\n", e.message);
            return false;
        }
        if (cs == WH_CLAIM_AHEAD) { /* the window is full: spec_gen must be sealed by now */
            if (wh_store_spec_locate(st, spec_gen, &gen, &e) && gen) return true;
            fprintf(stderr, "  claim: AHEAD before spec generation %llu was sealed\n",
                    (unsigned long long)spec_gen);
            return false;
        }
        if (cs == WH_CLAIM_WAIT) {
            wh_sleep_ms(1);
            continue;
        }
        if (retried && c.attempt > 1) (*retried)++;
        make_id_sample(c.index, buf, false, a);
        wh_spec_put_t ps;
        bool sealed;
        if (!wh_store_spec_put(st, &c, a, 2, &ps, &sealed, &e)) {
            fprintf(stderr, "  put of index %llu: %s\n", (unsigned long long)c.index, e.message);
            return false;
        }
    }
    fprintf(stderr, "  spec generation %llu not sealed after %d claims\n",
            (unsigned long long)spec_gen, max_claims);
    return false;
}

/* Spec generation spec_gen is sealed in exactly one area and reads back
 * exactly: position p holds sample index spec_gen * cap + p. */
static bool spec_exact(wh_store_t *st, const wh_store_config_t *c, uint64_t spec_gen) {
    wh_err_t e;
    uint64_t gen = 0;
    if (!wh_store_spec_locate(st, spec_gen, &gen, &e) || !gen) {
        fprintf(stderr, "  spec generation %llu not located: %s\n", (unsigned long long)spec_gen,
                gen ? "" : e.message);
        return false;
    }
    if (!gen_holds(st, gen, c->swap_cap, spec_gen * c->swap_cap)) return false;
    wh_shm_layout_t L;
    wh_shm_layout(&L);
    char path[160];
    size_t len;
    unsigned char *seg = map_segment(c, &len, path, sizeof path);
    if (!seg) return false;
    int n = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char *sl = seg + L.slots + (size_t)i * L.slot_size;
        uint32_t state;
        memcpy(&state, sl + L.slot_spec_state, 4);
        n += get64(sl + L.slot_gen) && get64(sl + L.slot_spec_label) == spec_gen + 1 && state == 2;
    }
    munmap(seg, len);
    if (n != 1)
        fprintf(stderr, "  spec generation %llu sealed in %d areas\n", (unsigned long long)spec_gen,
                n);
    return n == 1;
}

/* Forks a child that makes spec generation target (claims and puts; in
 * mode 'f' its first claim is given back as failed for good) with
 * WIREHEAD_FAULT_SPEC_KILL=fault. 1: killed there; 0: it ended on its own
 * (that call has fewer steps); -1: anything else. */
static int spec_child(const wh_store_config_t *c, const char *fault, char mode, uint64_t target) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setenv("WIREHEAD_FAULT_SPEC_KILL", fault, 1);
        if (freopen("/dev/null", "w", stderr) == NULL) _exit(5);
        wh_err_t ce;
        wh_store_t *cs = wh_store_open(c, &ce);
        if (!cs) _exit(3);
        if (mode == 'f') {
            wh_claim_t cl;
            wh_claim_status_t st;
            bool failed;
            if (!wh_store_spec_claim(cs, 30.0, 3, &cl, &st, &ce) || st != WH_CLAIM_OK ||
                !wh_store_spec_fail(cs, &cl, 1, "ValueError: boom", &failed, &ce) || !failed)
                _exit(6);
            uint64_t g;
            _exit(wh_store_spec_locate(cs, target, &g, &ce) || ce.code != WH_E_SPECFAIL ? 7 : 0);
        }
        _exit(spec_make(cs, target, 100, NULL) ? 0 : 4);
    }
    return kid_fate(pid, "spec child", fault);
}

/* For each spec operation (claim, open, put, seal, fail, abandon) and each
 * of its store writes in turn, a child making the next spec generation is
 * SIGKILLed right after that write. The store's next participant (this
 * process) then makes that generation and three more: each sealed in one
 * area with exactly its indices at their positions, or, where the kill
 * came after the index's failure was recorded, a clear SpecFailed. A
 * generation whose last put died before its seal is sealed by a reader's
 * locate. Every area has held a generation before (a half-reset one would
 * still carry old claims and index entries). */
static void t_spec_killed_every_step(void) {
    static const struct {
        const char *op;
        int nth;   /* the call killed */
        char mode; /* 'o': the child opens target; 'a': target's area was abandoned; 'f': fails */
    } ops[] = {{"claim", 1, 'o'}, {"claim", 2, 'o'}, {"open", 1, 'o'}, {"put", 1, 'o'},
               {"put", 4, 'o'},   {"seal", 1, 'o'},  {"fail", 1, 'f'}, {"abandon", 1, 'a'}};
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    const uint32_t cap = 4;
    wh_store_config_t c = mkcfg(new_uri(), cap, 64 << 10, &s);
    c.spec = true;
    c.run_seed = 7;
    wh_store_t *st = NULL, *rd = NULL;
    int runs = 0;
    for (size_t o = 0; o < WH_ARRAY_LEN(ops); o++) {
        int step = 1;
        for (;; step++) {
            REQUIRE(step <= 32, "%s call %d has more than 32 steps", ops[o].op, ops[o].nth);
            wh_err_t e;
            st = wh_store_open(&c, &e);
            REQUIRE(st, "open: %s", e.message);
            rd = wh_store_open(&c, &e);
            REQUIRE(rd, "open: %s", e.message);
            for (uint64_t g = 0; g < 4; g++) /* every area holds a sealed generation */
                REQUIRE(spec_make(st, g, 40, NULL), "prime %s step %d", ops[o].op, step);
            REQUIRE(wh_store_spec_need(rd, 1, &e), "need: %s", e.message);
            uint64_t target = 4;
            if (ops[o].mode == 'a') { /* 4 open with one put, then out of the window */
                int32_t buf[600];
                wh_array_t a[2];
                wh_claim_t cl;
                wh_claim_status_t cs;
                wh_spec_put_t ps;
                bool sealed;
                REQUIRE(wh_store_spec_claim(st, 30.0, 3, &cl, &cs, &e) && cs == WH_CLAIM_OK &&
                            cl.spec_gen == 4,
                        "claim in 4: %s", e.message);
                make_id_sample(cl.index, buf, false, a);
                REQUIRE(wh_store_spec_put(st, &cl, a, 2, &ps, &sealed, &e), "put");
                target = 5;
                REQUIRE(wh_store_spec_need(rd, target, &e), "need: %s", e.message);
            }
            char fault[48];
            snprintf(fault, sizeof fault, "%s:%d:%d", ops[o].op, step, ops[o].nth);
            int r = spec_child(&c, fault, ops[o].mode, target);
            REQUIRE(r >= 0, "child %s", fault);
            if (r == 1) runs++;
            /* a generation complete but unsealed is sealed by a reader */
            wh_spec_status_t ss;
            uint64_t g = 0;
            REQUIRE(wh_store_spec_status(rd, &ss, &e), "status: %s", e.message);
            bool failed = ss.failed;
            if (ss.open && ss.open_gen == target && ss.open_fill == cap)
                CHECK(wh_store_spec_locate(rd, target, &g, &e) && g,
                      "%s: a complete generation is not sealed by a reader's locate", fault);
            if (failed) { /* the kill came after the failure was recorded */
                CHECK(ops[o].mode == 'f' && step >= 2, "%s: failed: %s", fault, ss.failure);
                CHECK(!wh_store_spec_locate(rd, target, &g, &e) && e.code == WH_E_SPECFAIL &&
                          strstr(e.message, "sample index 16 (generation 4, position 0) failed "
                                            "1 attempts; last by pid") &&
                          strstr(e.message, ": ValueError: boom"),
                      "%s: locate of a failed generation: %s", fault, e.message);
            } else {
                uint32_t retried = 0;
                CHECK(spec_make(st, target, 40, &retried), "%s: make %llu after the kill", fault,
                      (unsigned long long)target);
                CHECK(spec_exact(st, &c, target), "%s: spec generation %llu", fault,
                      (unsigned long long)target);
                REQUIRE(wh_store_spec_need(rd, target, &e), "need: %s", e.message);
                for (uint64_t k = target + 1; k < target + 4 && case_ok; k++)
                    CHECK(spec_make(st, k, 40, NULL) && spec_exact(st, &c, k),
                          "%s: spec generation %llu after the kill", fault, (unsigned long long)k);
                CHECK(areas_distinct(st), "%s: areas", fault);
            }
            wh_store_destroy(rd);
            wh_store_destroy(st);
            rd = st = NULL;
            clean_store(&c);
            if (!case_ok) return;
            if (r == 0) break; /* every step of this call done */
        }
        CHECK(step > 1, "%s: no step was ever reached", ops[o].op);
        fprintf(stderr, "     %s call %d: %d steps\n", ops[o].op, ops[o].nth, step - 1);
    }
    fprintf(stderr, "     %d kill runs\n", runs);
    return;
out:
    if (rd) wh_store_destroy(rd);
    if (st) wh_store_destroy(st);
    clean_store(&c);
}

/* BYTE_BUDGET of exactly SWAP_CAP samples: a generator SIGKILLed between
 * reserving a sample's bytes and recording the reservation loses them; the
 * generation must still complete (its bytes are found again from the
 * index), exactly. */
static void t_spec_killed_put_tight_budget(void) {
    wh_schema_t s = schema_of(2, NAMES_ID_DATA);
    const uint32_t cap = 4;
    wh_store_config_t c = mkcfg(new_uri(), cap, 4096, &s);
    c.spec = true;
    c.run_seed = 7;
    wh_err_t e;
    wh_store_t *st = NULL;
    /* data of n int32: the largest n whose cap samples fit 4096 bytes */
    static int32_t buf[1024];
    static int64_t idv;
    int64_t n = 1;
    wh_array_t a[2];
    wh_sample_meta_t m;
    for (;; n++) {
        a[0] = arr0(WH_DT_I64, &idv);
        a[1] = arr1(WH_DT_I32, n + 1, 4, buf);
        REQUIRE(wh_sample_plan(&s, a, 2, &m, &e), "plan: %s", e.message);
        if (m.total_size * cap > 4096) break;
    }
    a[1] = arr1(WH_DT_I32, n, 4, buf);
    REQUIRE(wh_sample_plan(&s, a, 2, &m, &e) && 4096 - m.total_size * cap < m.total_size,
            "a sample of %lld int32 leaves room for a fifth", (long long)n);
    st = wh_store_open(&c, &e);
    REQUIRE(st, "open: %s", e.message);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        setenv("WIREHEAD_FAULT_SPEC_KILL", "put:2:1", 1);
        if (freopen("/dev/null", "w", stderr) == NULL) _exit(5);
        wh_store_t *cs = wh_store_open(&c, &e);
        wh_claim_t cl;
        wh_claim_status_t cst;
        wh_spec_put_t ps;
        bool sealed;
        idv = 0;
        if (!cs || !wh_store_spec_claim(cs, 30.0, 3, &cl, &cst, &e) || cst != WH_CLAIM_OK) _exit(3);
        wh_store_spec_put(cs, &cl, a, 2, &ps, &sealed, &e);
        _exit(0);
    }
    REQUIRE(kid_fate(pid, "tight-budget child", "put:2:1") == 1, "the child was not killed");
    bool sealed = false;
    for (uint32_t i = 0; i < cap; i++) {
        wh_claim_t cl;
        wh_claim_status_t cst;
        wh_spec_put_t ps;
        REQUIRE(wh_store_spec_claim(st, 30.0, 3, &cl, &cst, &e) && cst == WH_CLAIM_OK,
                "claim %u: %s", i, e.message);
        CHECK(cl.index == i && cl.attempt == (i ? 1u : 2u), "claim %u: index %llu attempt %u", i,
              (unsigned long long)cl.index, cl.attempt);
        idv = (int64_t)cl.index;
        for (int64_t k = 0; k < n; k++) buf[k] = data_val(cl.index, k);
        REQUIRE(wh_store_spec_put(st, &cl, a, 2, &ps, &sealed, &e) && ps == WH_SPEC_PUT_ACCEPTED,
                "put of index %llu with a lost reservation in the area: %s",
                (unsigned long long)cl.index, e.message);
    }
    CHECK(sealed, "the last put sealed");
    uint64_t g = 0;
    REQUIRE(wh_store_spec_locate(st, 0, &g, &e) && g, "locate: %s", e.message);
    for (uint32_t p = 0; p < cap; p++) {
        int64_t rid = -1;
        static int32_t rbuf[1024];
        dest_t d = {.buf = {&rid, rbuf}, .cap = {8, sizeof rbuf}};
        wh_sample_meta_t rm;
        CHECK(wh_store_read(st, g, p, dest_cb, &d, &rm, &e) && rid == p && rm.f[1].shape[0] == n &&
                  rbuf[n - 1] == data_val(p, n - 1),
              "position %u: id %lld (%s)", p, (long long)rid, e.message);
    }
out:
    if (st) wh_store_destroy(st);
    clean_store(&c);
}

int main(int argc, char **argv) {
    signal(SIGALRM, on_fatal);
    signal(SIGINT, on_fatal);
    signal(SIGTERM, on_fatal);
    signal(SIGHUP, on_fatal);
    signal(SIGPIPE, on_fatal); /* e.g. output piped into `head` */
    static const struct {
        const char *name;
        void (*fn)(void);
        bool by_name_only;
    } cases[] = {
        {"sample round trip: every dtype x layout", t_sample_roundtrip, false},
        {"sample plan rejects bad arrays", t_sample_plan_rejects, false},
        {"sample decode rejects corrupted headers and data", t_sample_corrupt, false},
        {"store put/seal/read, exact generations", t_store_basic, false},
        {"store round trip: every dtype x layout", t_store_dtypes, false},
        {"store flipped byte -> WH_E_CORRUPT", t_store_corrupt_bytes, false},
        {"store reclaimed generation -> WH_E_GONE", t_store_gone, false},
        {"store-backed views: pinned across seals, one generation per process", t_store_views,
         false},
        {"store read racing reclamation -> WH_E_GONE", t_store_torn_read, false},
        {"store open errors (schema, SWAP_CAP, names)", t_store_open_errors, false},
        {"scheme table, capabilities, a backend without optional ops", t_backend_table, false},
        {"a node-local copy's source: recorded, checked, shown", t_store_origin, false},
        {"store sample too big / budget exhausted", t_store_toobig, false},
        {"store surplus puts discarded at once", t_store_discard_fast, false},
        {"lease between handles, expiry, resign", t_lease_handles, false},
        {"lease of a dead child is taken at once", t_lease_dead_child, false},
        {"handle used after fork refuses", t_fork_handle, false},
        {"forged area counts and a truncated segment are errors", t_hostile_area, false},
        {"stopped lock holder, garbage lock, forged lease: bounded", t_hostile_locks, false},
        {"segment of another user or not mode 0600 refused", t_segment_owner_mode, false},
        {"generator SIGKILLed inside a put", t_killed_put, false},
        {"generator SIGKILLed at every step of a seal", t_seal_killed_every_step, false},
        {"spec generator SIGKILLed at every step of claim/open/put/seal/fail/abandon",
         t_spec_killed_every_step, false},
        {"spec put killed with its bytes reserved, unrecorded, in a tight budget",
         t_spec_killed_put_tight_budget, false},
        {"live paused writer blocks slot recycling", t_live_writer_blocks_recycle, false},
        {"killed put with a tight budget does not wedge", t_killed_put_tight_budget, false},
        {"stale half-created segment is replaced", t_stale_segment, false},
        {"an empty segment was cut: refused at once", t_empty_segment_was_cut, false},
        {"store too big for /dev/shm fails at creation", t_too_big_for_shm, false},
        {"generation ids increase across re-creation", t_gen_ids_survive_recreate, false},
        {"3 writers + manager + reader through 320 swaps", t_concurrent, false},
        {"params: versions, the bound, damage, a dead setter's lock", t_params, false},
        {"workers' ring: hand-over, checks, release, growth, reclaim, truncation", t_ring, false},
        {"workers' ring: many large rows checked by several threads", t_ring_rows, false},
        {"workers' ring: a fill from the store, pad='ignore', another shape, heap", t_ring_fill,
         false},
        {"workers' ring: large rows left in the store, no pin kept, heap gathered whole",
         t_ring_fill_direct, false},
        {"stress: generation ids after seals faster than 1/us", t_gen_ids_fast_seals, true},
    };
    for (size_t i = 0; i < WH_ARRAY_LEN(cases); i++) {
        bool run = argc < 2 && !cases[i].by_name_only;
        for (int k = 1; k < argc; k++)
            if (strstr(cases[i].name, argv[k])) run = true;
        if (run) case_run(cases[i].name, cases[i].fn);
    }
    remove_all_stores();
    printf("%u passed, %u failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
