/* libFuzzer: an shm segment damaged by hostile bytes. Each input is a list
 * of patches (u32 offset, u8 length, bytes; a first byte of 0xff also
 * truncates the data part) applied to a real segment holding one sealed
 * generation; opening it and every operation on it must end in a result or
 * an error, never a crash, an overrun or an unbounded wait (locks wait the
 * 10 ms lease). The magic stays intact and the header whole: a segment
 * without them is one still being created, which openers wait for (5 s). */
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

static char uri[64], path[96];
static unsigned char *snap;
static size_t snap_len, hdr_len;
static wh_store_config_t cfg;

static void put_one(wh_store_t *st, int64_t id) {
    int64_t ident[2] = {7, id};
    float vals[32];
    for (int i = 0; i < 32; i++) vals[i] = (float)(id * 100 + i);
    wh_array_t a[2] = {
        {.dtype = WH_DT_I64, .ndim = 1, .shape = {2}, .strides = {8}, .data = ident},
        {.dtype = WH_DT_F32, .ndim = 1, .shape = {32}, .strides = {4}, .data = vals}};
    wh_put_status_t ps;
    wh_err_t e;
    wh_store_put(st, a, 2, 0, &ps, NULL, &e);
}

static void cleanup(void) { unlink(path); }

static void setup(void) {
    static const char *const names[] = {"id", "data"};
    snprintf(uri, sizeof uri, "shm://whfuzzseg%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/wirehead.whfuzzseg%d", (int)getpid());
    memset(&cfg, 0, sizeof cfg);
    cfg.uri = uri;
    cfg.swap_cap = 2;
    if (!wh_schema_init(&cfg.schema, 2, names, NULL)) abort();
    cfg.byte_budget = 4096;
    cfg.lease_s = 0.01;
    cfg.verify_reads = true;
    /* made by a child that exits: the segment's creator is a dead pid */
    pid_t child = fork();
    if (child == 0) {
        wh_err_t e;
        wh_store_t *st = wh_store_open(&cfg, &e);
        if (!st) {
            fprintf(stderr, "fuzz_segment: %s\n", e.message);
            _exit(1);
        }
        bool lead, sealed;
        wh_seal_info_t info;
        put_one(st, 1);
        put_one(st, 2);
        wh_store_lead(st, &lead, &e);
        wh_store_seal(st, &sealed, &info, &e);
        put_one(st, 3); /* one in the write generation too */
        wh_store_destroy(st);
        _exit(0);
    }
    int status = 1;
    if (child < 0 || waitpid(child, &status, 0) != child || status != 0) abort();
    wh_shm_layout_t L;
    wh_shm_layout(&L);
    hdr_len = L.slots + 4 * L.slot_size;
    FILE *f = fopen(path, "rb");
    if (!f) abort();
    fseek(f, 0, SEEK_END);
    snap_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    snap = malloc(snap_len);
    if (!snap || fread(snap, 1, snap_len, f) != snap_len) abort();
    fclose(f);
    cfg.no_create = true;
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!snap) setup();
    unsigned char *img = malloc(snap_len);
    if (!img) return 0;
    memcpy(img, snap, snap_len);
    size_t len = snap_len, i = 0;
    if (size >= 5 && data[0] == 0xff) { /* truncated after the header */
        len = hdr_len + (size_t)(data[1] | data[2] << 8 | data[3] << 16) % (snap_len - hdr_len);
        i = 5;
    }
    while (i + 5 <= size) {
        uint32_t off;
        memcpy(&off, data + i, 4);
        size_t n = data[i + 4];
        i += 5;
        if (n > size - i) n = size - i;
        off = 8 + off % (uint32_t)(snap_len - 8); /* not the magic */
        if (n > snap_len - off) n = snap_len - off;
        memcpy(img + off, data + i, n);
        i += n;
    }
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0 || pwrite(fd, img, len, 0) != (ssize_t)len)
        abort();
    fchmod(fd, 0600);
    close(fd);
    free(img);
    wh_err_t e;
    wh_store_t *st = wh_store_open(&cfg, &e);
    if (!st) return 0;
    wh_status_t o;
    uint64_t g = 0;
    wh_store_status(st, &o, &e);
    wh_store_current(st, &g, &e);
    wh_sample_meta_t m;
    for (uint32_t p = 0; p < cfg.swap_cap; p++) {
        wh_store_read(st, g, p, NULL, NULL, &m, &e);
        wh_buf_t *v = NULL;
        if (wh_store_view(st, g, p, &v, &m, &e)) wh_buf_unref(v);
    }
    put_one(st, 4);
    bool lead, sealed;
    wh_seal_info_t info;
    if (wh_store_lead(st, &lead, &e) && lead) wh_store_seal(st, &sealed, &info, &e);
    wh_store_destroy(st);
    return 0;
}
