/* libFuzzer: an shm segment damaged by hostile bytes. Each input is a list
 * of patches (u32 offset, u8 length, bytes; a first byte of 0xff also
 * truncates the data part) applied to two real segments: a plain store
 * holding one sealed generation and a write generation, and a spec-mode
 * store (RUN_SEED) holding a sealed spec generation, an open one with a
 * put and a claim its dead claimer left, a params copy and the claims and
 * labels of both. Opening each and every operation on it must end in a
 * result or an error, never a crash, an overrun or an unbounded wait (locks
 * wait the 10 ms lease). The magic stays intact and the header whole: a
 * segment without them is one still being created, which openers wait for
 * (5 s). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wh_shm.h"
#include "wh_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    char uri[64], path[96];
    unsigned char *snap;
    size_t snap_len;
    wh_store_config_t cfg;
} seg_t;

static seg_t plain, spec;
static size_t hdr_len;

static void sample_of(int64_t id, int64_t ident[2], float vals[32], wh_array_t a[2]) {
    ident[0] = 7;
    ident[1] = id;
    for (int i = 0; i < 32; i++) vals[i] = (float)(id * 100 + i);
    a[0] = (wh_array_t){.dtype = WH_DT_I64, .ndim = 1, .shape = {2}, .strides = {8}, .data = ident};
    a[1] = (wh_array_t){.dtype = WH_DT_F32, .ndim = 1, .shape = {32}, .strides = {4}, .data = vals};
}

static void put_one(wh_store_t *st, int64_t id) {
    int64_t ident[2];
    float vals[32];
    wh_array_t a[2];
    sample_of(id, ident, vals, a);
    wh_put_status_t ps;
    wh_err_t e;
    wh_store_put(st, a, 2, 0, &ps, NULL, &e);
}

/* Claims the next index and puts it (put false: leaves the claim held). */
static void spec_one(wh_store_t *st, bool put, double lease_s) {
    wh_claim_t c;
    wh_claim_status_t cs;
    wh_err_t e;
    if (!wh_store_spec_claim(st, lease_s, 3, &c, &cs, &e) || cs != WH_CLAIM_OK) return;
    char *doc = NULL;
    size_t len;
    if (wh_store_spec_params(st, &c, &doc, &len, &e)) free(doc);
    bool mine, sealed;
    wh_store_spec_renew(st, &c, lease_s, &mine, &e);
    if (!put) return;
    int64_t ident[2];
    float vals[32];
    wh_array_t a[2];
    sample_of((int64_t)c.index, ident, vals, a);
    wh_spec_put_t ps;
    wh_store_spec_put(st, &c, a, 2, &ps, &sealed, &e);
}

static void cleanup(void) {
    unlink(plain.path);
    unlink(spec.path);
    char pf[160];
    snprintf(pf, sizeof pf, "/dev/shm/wirehead-params.whfuzzspec%d", (int)getpid());
    unlink(pf);
}

/* Made by a child that exits: the segment's creator (and the spec
 * store's claimer) is a dead pid. */
static void make(seg_t *g, const char *kind, bool is_spec) {
    static const char *const names[] = {"id", "data"};
    snprintf(g->uri, sizeof g->uri, "shm://whfuzz%s%d", kind, (int)getpid());
    snprintf(g->path, sizeof g->path, "/dev/shm/wirehead.whfuzz%s%d", kind, (int)getpid());
    memset(&g->cfg, 0, sizeof g->cfg);
    g->cfg.uri = g->uri;
    g->cfg.swap_cap = 2;
    if (!wh_schema_init(&g->cfg.schema, 2, names, NULL)) abort();
    g->cfg.byte_budget = 4096;
    g->cfg.lease_s = 0.01;
    g->cfg.verify_reads = true;
    g->cfg.spec = is_spec;
    g->cfg.run_seed = is_spec ? 7 : 0;
    pid_t child = fork();
    if (child == 0) {
        wh_err_t e;
        wh_store_t *st = wh_store_open(&g->cfg, &e);
        if (!st) {
            fprintf(stderr, "fuzz_segment: %s\n", e.message);
            _exit(1);
        }
        if (is_spec) {
            uint64_t v;
            wh_store_params_set(st, "{\"a\": 1}", 8, &v, &e);
            spec_one(st, true, 60); /* spec generation 0, sealed */
            spec_one(st, true, 60);
            spec_one(st, true, 60); /* 1: one put, one claim left held */
            spec_one(st, false, 60);
            wh_store_spec_need(st, 1, &e);
        } else {
            bool lead, sealed;
            wh_seal_info_t info;
            put_one(st, 1);
            put_one(st, 2);
            wh_store_lead(st, &lead, &e);
            wh_store_seal(st, &sealed, &info, &e);
            put_one(st, 3); /* one in the write generation too */
        }
        wh_store_destroy(st);
        _exit(0);
    }
    int status = 1;
    if (child < 0 || waitpid(child, &status, 0) != child || status != 0) abort();
    FILE *f = fopen(g->path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    g->snap_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    g->snap = malloc(g->snap_len);
    if (!g->snap || fread(g->snap, 1, g->snap_len, f) != g->snap_len) abort();
    fclose(f);
    g->cfg.no_create = true;
}

static void setup(void) {
    wh_shm_layout_t L;
    wh_shm_layout(&L);
    hdr_len = L.slots + 4 * L.slot_size;
    make(&plain, "seg", false);
    make(&spec, "spec", true);
    atexit(cleanup);
}

/* Writes g's snapshot with the input's patches to its file. */
static void patched(const seg_t *g, const uint8_t *data, size_t size) {
    unsigned char *img = malloc(g->snap_len);
    if (!img) abort();
    memcpy(img, g->snap, g->snap_len);
    size_t len = g->snap_len, i = 0;
    if (size >= 5 && data[0] == 0xff) { /* truncated after the header */
        len = hdr_len + (size_t)(data[1] | data[2] << 8 | data[3] << 16) % (g->snap_len - hdr_len);
        i = 5;
    }
    while (i + 5 <= size) {
        uint32_t off;
        memcpy(&off, data + i, 4);
        size_t n = data[i + 4];
        i += 5;
        if (n > size - i) n = size - i;
        off = 8 + off % (uint32_t)(g->snap_len - 8); /* not the magic */
        if (n > g->snap_len - off) n = g->snap_len - off;
        memcpy(img + off, data + i, n);
        i += n;
    }
    int fd = open(g->path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0 || pwrite(fd, img, len, 0) != (ssize_t)len)
        abort();
    fchmod(fd, 0600);
    close(fd);
    free(img);
}

static void plain_ops(void) {
    wh_err_t e;
    wh_store_t *st = wh_store_open(&plain.cfg, &e);
    if (!st) return;
    wh_status_t o;
    uint64_t g = 0;
    wh_store_status(st, &o, &e);
    wh_store_current(st, &g, &e);
    wh_sample_meta_t m;
    for (uint32_t p = 0; p < plain.cfg.swap_cap; p++) {
        wh_store_read(st, g, p, NULL, NULL, &m, &e);
        wh_buf_t *v = NULL;
        if (wh_store_view(st, g, p, &v, &m, &e)) wh_buf_unref(v);
    }
    put_one(st, 4);
    bool lead, sealed;
    wh_seal_info_t info;
    if (wh_store_lead(st, &lead, &e) && lead) wh_store_seal(st, &sealed, &info, &e);
    wh_store_destroy(st);
}

static void spec_ops(void) {
    wh_err_t e;
    wh_store_t *st = wh_store_open(&spec.cfg, &e);
    if (!st) return;
    wh_spec_status_t ss;
    wh_status_t o;
    wh_store_spec_status(st, &ss, &e);
    wh_store_status(st, &o, &e);
    for (uint64_t s = 0; s < 3; s++) {
        uint64_t g = 0;
        if (!wh_store_spec_locate(st, s, &g, &e) || !g) continue;
        wh_read_at_t at = {.gen = g, .exact = true, .spec_gen = s};
        wh_sample_meta_t m;
        for (at.pos = 0; at.pos < spec.cfg.swap_cap; at.pos++)
            wh_store_read_sample(st, &at, 0.0, NULL, NULL, NULL, &m, &e);
    }
    wh_store_spec_need(st, 0, &e);
    /* a claim given back, then claims put until the window is full */
    wh_claim_t c;
    wh_claim_status_t cs;
    bool failed;
    if (wh_store_spec_claim(st, 0.01, 3, &c, &cs, &e) && cs == WH_CLAIM_OK)
        wh_store_spec_fail(st, &c, 3, "ValueError: fuzz", &failed, &e);
    for (int i = 0; i < 4; i++) spec_one(st, true, 0.01);
    bool lead, sealed;
    wh_seal_info_t info;
    if (wh_store_lead(st, &lead, &e) && lead) wh_store_seal(st, &sealed, &info, &e);
    wh_store_spec_status(st, &ss, &e);
    wh_store_destroy(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!plain.snap) setup();
    patched(&plain, data, size);
    plain_ops();
    patched(&spec, data, size);
    spec_ops();
    return 0;
}
