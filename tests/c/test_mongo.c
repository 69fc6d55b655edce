/* C-level tests of the MongoDB store (ext/mongo/wh_mongo.c) against a real
 * wire-protocol server.
 *
 * Uses WH_MONGO_URI (e.g. mongodb://127.0.0.1:27017) when set; otherwise
 * starts the in-memory test server itself (tests/mongo/MongoTestServer.java
 * with the jars in WIREHEAD_MONGO_JARS or .deps/mongo-java-server, run from
 * the repository root) and stops it at the end.
 *
 *   make -f tests/c/mongo.mk ctest-mongo
 *
 * Each test uses its own database, so one server serves all of them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <mongoc/mongoc.h>
#include <xxhash.h>

#include "wh_backend.h"
#include "wh_relay.h"
#include "wh_store.h"

extern char **environ;

static int failures;
static char base_uri[256];

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---- the test server ---- */

static pid_t server_pid;
static int server_stdin = -1;

static void start_server(void) {
    const char *jars = getenv("WIREHEAD_MONGO_JARS");
    char cp[1024];
    snprintf(cp, sizeof cp, "%s/*", jars && *jars ? jars : ".deps/mongo-java-server");
    int in[2], out[2];
    REQUIRE(pipe(in) == 0 && pipe(out) == 0, "pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char *argv[] = {"java", "-XX:+UseSerialGC", "-cp", cp, "tests/mongo/MongoTestServer.java", "0",
                    NULL};
    int r = posix_spawnp(&server_pid, "java", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(r == 0, "spawn java: %s", strerror(r));
    close(in[0]);
    close(out[1]);
    server_stdin = in[1];
    char line[256];
    size_t n = 0;
    uint64_t deadline = wh_now_mono_ns() + 90ull * 1000000000ull;
    while (!memchr(line, '\n', n)) {
        struct pollfd p = {out[0], POLLIN, 0};
        int left = (int)((deadline - wh_now_mono_ns()) / 1000000);
        REQUIRE(wh_now_mono_ns() < deadline && poll(&p, 1, left > 0 ? left : 0) == 1,
                "test server did not start within 90 s");
        ssize_t k = read(out[0], line + n, sizeof line - 1 - n);
        REQUIRE(k > 0, "test server exited before listening (jars fetched? tests/mongo/fetch.sh)");
        n += (size_t)k;
        line[n] = '\0';
        REQUIRE(n < sizeof line - 1, "unexpected output from the test server");
    }
    close(out[0]);
    int port = 0;
    REQUIRE(sscanf(line, "LISTENING %d", &port) == 1, "bad line from test server: %s", line);
    snprintf(base_uri, sizeof base_uri, "mongodb://127.0.0.1:%d", port);
}

static void stop_server(void) {
    if (!server_pid) return;
    close(server_stdin); /* the server exits at end of its stdin */
    int status;
    waitpid(server_pid, &status, 0);
    server_pid = 0;
}

/* ---- helpers ---- */

static const char *FIELDS[] = {"id", "data", "mask"};

static void uri_for(char *out, size_t cap, const char *db) {
    snprintf(out, cap, "%s/%s", base_uri, db);
}

static wh_store_config_t config(const char *uri, uint32_t cap, uint64_t chunk) {
    wh_store_config_t c;
    memset(&c, 0, sizeof c);
    c.uri = uri;
    c.swap_cap = cap;
    wh_err_t err = {0};
    REQUIRE(wh_schema_init(&c.schema, 3, FIELDS, &err), "%s", err.message);
    c.chunk_bytes = chunk;
    c.prefix = "wirehead";
    c.lease_s = 5.0;
    c.connect_timeout_s = 10.0;
    c.verify_reads = true;
    return c;
}

static wh_store_t *open_store(const wh_store_config_t *c) {
    wh_err_t err = {0};
    wh_store_t *st = wh_store_open(c, &err);
    REQUIRE(st, "open %s: %s", c->uri, err.message);
    return st;
}

/* Deterministic test sample of (writer, counter): id = {writer, counter};
 * data: float32[n] and mask: uint8[m] from a PRNG seeded by both. */
typedef struct {
    int64_t id[2];
    float *data;
    uint8_t *mask;
    int64_t n, m;
} sample_t;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static void make_sample(sample_t *s, int64_t writer, int64_t counter, int64_t maxn) {
    uint64_t seed = mix((uint64_t)writer * 1000003u + (uint64_t)counter);
    s->id[0] = writer;
    s->id[1] = counter;
    s->n = (int64_t)(seed % (uint64_t)(maxn + 1));
    s->m = (int64_t)((seed >> 20) % 97);
    s->data = malloc((size_t)(s->n ? s->n : 1) * sizeof(float));
    s->mask = malloc((size_t)(s->m ? s->m : 1));
    for (int64_t k = 0; k < s->n; k++) s->data[k] = (float)(mix(seed + (uint64_t)k) % 100000) / 7.f;
    for (int64_t k = 0; k < s->m; k++) s->mask[k] = (uint8_t)mix(~seed + (uint64_t)k);
}

static void free_sample(sample_t *s) {
    free(s->data);
    free(s->mask);
}

static void sample_arrays(sample_t *s, wh_array_t a[3]) {
    memset(a, 0, 3 * sizeof *a);
    a[0].dtype = WH_DT_I64;
    a[0].ndim = 1;
    a[0].shape[0] = 2;
    a[0].strides[0] = 8;
    a[0].data = s->id;
    a[1].dtype = WH_DT_F32;
    a[1].ndim = 1;
    a[1].shape[0] = s->n;
    a[1].strides[0] = 4;
    a[1].data = s->data;
    a[2].dtype = WH_DT_U8;
    a[2].ndim = 2;
    a[2].shape[0] = 1;
    a[2].shape[1] = s->m;
    a[2].strides[0] = s->m;
    a[2].strides[1] = 1;
    a[2].data = s->mask;
}

static bool put_sample(wh_store_t *st, int64_t writer, int64_t counter, int64_t maxn,
                       wh_put_status_t *ps, wh_err_t *err) {
    sample_t s;
    wh_array_t a[3];
    make_sample(&s, writer, counter, maxn);
    sample_arrays(&s, a);
    uint64_t gen;
    bool ok = wh_store_put(st, a, 3, 0, ps, &gen, err);
    free_sample(&s);
    return ok;
}

/* Read destination: buffers grown to fit. */
typedef struct {
    void *buf[3];
    uint64_t cap[3];
} dest_t;

static bool dest_fn(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err) {
    dest_t *d = ctx;
    for (int i = 0; i < meta->nfields; i++) {
        uint64_t need = meta->f[i].nbytes ? meta->f[i].nbytes : 1;
        if (d->cap[i] < need) {
            void *p = realloc(d->buf[i], need);
            if (!p) return wh_err_set(err, WH_E_SYS, "oom");
            d->buf[i] = p;
            d->cap[i] = need;
        }
        memset(d->buf[i], 0xAB, need); /* stale bytes must not survive a read */
        dst[i] = d->buf[i];
    }
    return true;
}

static void dest_free(dest_t *d) {
    for (int i = 0; i < 3; i++) free(d->buf[i]);
}

/* Reads (gen, pos) and checks it against its id; returns the id. */
static bool read_check(wh_store_t *st, uint64_t gen, uint32_t pos, int64_t maxn, dest_t *d,
                       int64_t id[2], wh_err_t *err) {
    wh_sample_meta_t meta;
    if (!wh_store_read(st, gen, pos, dest_fn, d, &meta, err)) return false;
    memcpy(id, d->buf[0], 16);
    sample_t s;
    make_sample(&s, id[0], id[1], maxn);
    bool ok = meta.f[1].shape[0] == s.n && meta.f[2].shape[1] == s.m &&
              memcmp(d->buf[1], s.data, (size_t)s.n * 4) == 0 &&
              memcmp(d->buf[2], s.mask, (size_t)s.m) == 0;
    free_sample(&s);
    if (!ok)
        return wh_err_set(err, WH_E_INTERNAL, "gen %llu pos %u: bytes do not match id %lld/%lld",
                          (unsigned long long)gen, pos, (long long)id[0], (long long)id[1]);
    return true;
}

/* Raw libmongoc access for damaging and inspecting the store. */
static mongoc_client_t *raw_client(void) {
    mongoc_client_t *c = mongoc_client_new(base_uri);
    REQUIRE(c, "raw client");
    mongoc_client_set_error_api(c, 2);
    return c;
}

static int count_prefix_collections(mongoc_client_t *c, const char *db, const char *prefix) {
    mongoc_database_t *d = mongoc_client_get_database(c, db);
    bson_error_t e;
    char **names = mongoc_database_get_collection_names_with_opts(d, NULL, &e);
    REQUIRE(names, "list collections: %s", e.message);
    int n = 0;
    for (char **p = names; *p; p++) n += strncmp(*p, prefix, strlen(prefix)) == 0;
    bson_strfreev(names);
    mongoc_database_destroy(d);
    return n;
}

static bool seal_now(wh_store_t *st, wh_seal_info_t *info) {
    bool sealed = false;
    wh_err_t err = {0};
    REQUIRE(wh_store_seal(st, &sealed, info, &err), "seal: %s", err.message);
    return sealed;
}

/* ---- tests ---- */

static void test_roundtrip_and_straddling_chunks(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_roundtrip");
    /* 100-byte chunks: most chunks straddle field boundaries and padding */
    wh_store_config_t c = config(uri, 5, 100);
    wh_store_t *st = open_store(&c);
    wh_err_t err = {0};
    bool leader = false;
    REQUIRE(wh_store_lead(st, &leader, &err) && leader, "lead: %s", err.message);
    wh_seal_info_t info;
    CHECK(!seal_now(st, &info), "an empty generation must not seal");
    uint64_t g0 = 0;
    REQUIRE(wh_store_current(st, &g0, &err), "%s", err.message);
    CHECK(g0 == 0, "no generation before the first seal, got %llu", (unsigned long long)g0);
    int accepted = 0, discarded = 0;
    for (int i = 0; i < 8; i++) {
        wh_put_status_t ps;
        REQUIRE(put_sample(st, 1, i, 700, &ps, &err), "put: %s", err.message);
        accepted += ps == WH_PUT_ACCEPTED;
        discarded += ps == WH_PUT_DISCARDED;
    }
    CHECK(accepted == 5 && discarded == 3, "accepted %d discarded %d", accepted, discarded);
    wh_status_t s;
    REQUIRE(wh_store_status(st, &s, &err), "%s", err.message);
    CHECK(s.write_fill == 5 && s.discarded == 3 && s.read_gen == 0, "fill %u discarded %llu",
          s.write_fill, (unsigned long long)s.discarded);
    CHECK(s.leader_pid == (uint64_t)getpid(), "leader pid %llu", (unsigned long long)s.leader_pid);
    REQUIRE(seal_now(st, &info), "a full generation seals");
    uint64_t g = 0;
    REQUIRE(wh_store_current(st, &g, &err), "%s", err.message);
    CHECK(g == info.generation && g == s.write_gen, "current %llu sealed %llu",
          (unsigned long long)g, (unsigned long long)info.generation);
    dest_t d = {0};
    bool seen[5] = {0};
    for (uint32_t p = 0; p < 5; p++) {
        int64_t id[2];
        bool ok = read_check(st, g, p, 700, &d, id, &err);
        CHECK(ok, "read %u: %s", p, err.message);
        if (ok && id[1] >= 0 && id[1] < 5) {
            CHECK(!seen[id[1]], "sample %lld twice in one generation", (long long)id[1]);
            seen[id[1]] = true;
        }
    }
    for (int i = 0; i < 5; i++) CHECK(seen[i], "the first 5 puts are the generation (%d)", i);
    /* reading only some fields */
    wh_err_clear(&err);
    CHECK(!wh_store_read(st, g, 5, dest_fn, &d, NULL, &err) && err.code == WH_E_INVALID,
          "position past SWAP_CAP: %s", err.message);
    wh_err_clear(&err);
    CHECK(!wh_store_read(st, g + 1, 0, dest_fn, &d, NULL, &err) && err.code == WH_E_NOTFOUND,
          "unsealed generation: %d %s", err.code, err.message);
    REQUIRE(wh_store_status(st, &s, &err), "%s", err.message);
    CHECK(s.seals == 1 && s.generated == 5 && s.nhistory == 1 && s.history[0].generation == g &&
              s.write_gen == g + 1,
          "status after seal: seals %llu generated %llu", (unsigned long long)s.seals,
          (unsigned long long)s.generated);
    dest_free(&d);
    wh_store_destroy(st);
}

static void test_lease(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_lease");
    wh_store_config_t c = config(uri, 2, 1024);
    c.lease_s = 0.5;
    wh_store_t *a = open_store(&c), *b = open_store(&c);
    wh_err_t err = {0};
    bool la = false, lb = true;
    REQUIRE(wh_store_lead(a, &la, &err), "%s", err.message);
    REQUIRE(wh_store_lead(b, &lb, &err), "%s", err.message);
    CHECK(la && !lb, "one leader: a %d b %d", la, lb);
    REQUIRE(wh_store_lead(a, &la, &err) && la, "renew: %s", err.message);
    bool sealed = true;
    wh_seal_info_t info;
    wh_err_clear(&err);
    CHECK(!wh_store_seal(b, &sealed, &info, &err) && err.code == WH_E_LEASE,
          "non-leader seal refused: %d %s", err.code, err.message);
    /* a's lease expires (a "died"): b takes over */
    uint64_t t0 = wh_now_mono_ns();
    while (!lb && wh_now_mono_ns() - t0 < 5000000000ull) {
        REQUIRE(wh_store_lead(b, &lb, &err), "%s", err.message);
        if (!lb) wh_sleep_ms(50);
    }
    CHECK(lb, "b leads after a's lease expired");
    CHECK(wh_now_mono_ns() - t0 >= 300000000ull, "not before the lease ran out");
    REQUIRE(wh_store_lead(a, &la, &err), "%s", err.message);
    CHECK(!la, "a lost the lease to b");
    REQUIRE(wh_store_resign(b, &err), "%s", err.message);
    REQUIRE(wh_store_lead(a, &la, &err) && la, "a leads after b resigned: %s", err.message);
    wh_store_destroy(a);
    wh_store_destroy(b);
}

/* A generator that died between taking a counter slot and committing its
 * manifest leaves a hole; the next surplus put fills it. */
static void test_hole_repair(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_hole");
    wh_store_config_t c = config(uri, 4, 256);
    wh_store_t *st = open_store(&c);
    wh_err_t err = {0};
    wh_status_t s;
    REQUIRE(wh_store_status(st, &s, &err), "%s", err.message);
    mongoc_client_t *rc = raw_client();
    char coll[128];
    snprintf(coll, sizeof coll, "wirehead.gen.%llu", (unsigned long long)s.write_gen);
    mongoc_collection_t *col = mongoc_client_get_collection(rc, "t_hole", coll);
    /* two dead claimers: counter at 2, no manifests */
    bson_t *q = BCON_NEW("_id", BCON_UTF8("ctr"));
    bson_t *u = BCON_NEW("$inc", "{", "n", BCON_INT64(2), "}");
    bson_t *o = BCON_NEW("upsert", BCON_BOOL(true));
    bson_error_t e;
    REQUIRE(mongoc_collection_update_one(col, q, u, o, NULL, &e), "%s", e.message);
    int accepted = 0;
    for (int i = 0; i < 6; i++) {
        wh_put_status_t ps;
        REQUIRE(put_sample(st, 2, i, 300, &ps, &err), "put: %s", err.message);
        accepted += ps == WH_PUT_ACCEPTED;
    }
    CHECK(accepted == 4, "4 of 6 accepted despite two holes, got %d", accepted);
    bool leader;
    REQUIRE(wh_store_lead(st, &leader, &err) && leader, "%s", err.message);
    wh_seal_info_t info = {0};
    REQUIRE(seal_now(st, &info), "generation with repaired holes seals");
    dest_t d = {0};
    for (uint32_t p = 0; p < 4; p++) {
        int64_t id[2];
        CHECK(read_check(st, info.generation, p, 300, &d, id, &err), "pos %u: %s", p, err.message);
    }
    dest_free(&d);
    bson_destroy(q);
    bson_destroy(u);
    bson_destroy(o);
    mongoc_collection_destroy(col);
    mongoc_client_destroy(rc);
    wh_store_destroy(st);
}

static uint64_t fill_and_seal(wh_store_t *st, uint32_t cap, int64_t writer, int64_t *counter,
                              int64_t maxn) {
    wh_err_t err = {0};
    for (uint32_t i = 0; i < cap; i++) {
        wh_put_status_t ps;
        REQUIRE(put_sample(st, writer, (*counter)++, maxn, &ps, &err), "put: %s", err.message);
    }
    wh_seal_info_t info;
    REQUIRE(seal_now(st, &info), "seal after filling");
    return info.generation;
}

/* Reclamation: read, retiring and write generations only; a reader of a
 * reclaimed generation gets WH_E_GONE. */
static void test_bounded_and_gone(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_bounded");
    wh_store_config_t c = config(uri, 3, 512);
    wh_store_t *st = open_store(&c);
    wh_err_t err = {0};
    bool leader;
    REQUIRE(wh_store_lead(st, &leader, &err) && leader, "%s", err.message);
    mongoc_client_t *rc = raw_client();
    int64_t counter = 0;
    uint64_t first = fill_and_seal(st, 3, 3, &counter, 2000);
    uint64_t second = fill_and_seal(st, 3, 3, &counter, 2000);
    dest_t d = {0};
    int64_t id[2];
    CHECK(read_check(st, first, 0, 2000, &d, id, &err), "retiring generation still readable: %s",
          err.message);
    for (int k = 0; k < 6; k++) {
        fill_and_seal(st, 3, 3, &counter, 2000);
        /* state + (read, retiring, write) x (chunks, manifests) */
        int n = count_prefix_collections(rc, "t_bounded", "wirehead.");
        CHECK(n <= 7, "at most 3 generations stored, found %d collections", n);
    }
    wh_err_clear(&err);
    CHECK(!wh_store_read(st, first, 0, dest_fn, &d, NULL, &err) && err.code == WH_E_GONE,
          "reclaimed generation reads as gone: %d %s", err.code, err.message);
    wh_err_clear(&err);
    CHECK(!wh_store_read(st, second, 1, dest_fn, &d, NULL, &err) && err.code == WH_E_GONE,
          "reclaimed generation reads as gone: %d %s", err.code, err.message);
    dest_free(&d);
    mongoc_client_destroy(rc);
    wh_store_destroy(st);
}

/* XXH3 header hash as wh_sample.c computes it: the header and
 * descriptors, skipping the hash field itself (bytes [32,40)). */
static uint64_t header_hash(const uint8_t *b, size_t hsize) {
    XXH3_state_t *s = XXH3_createState();
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, b, 32);
    XXH3_64bits_update(s, b + 40, hsize - 40);
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

static void expect_corrupt(wh_store_t *st, uint64_t gen, uint32_t pos, const char *needle) {
    dest_t d = {0};
    wh_err_t err = {0};
    bool ok = wh_store_read(st, gen, pos, dest_fn, &d, NULL, &err);
    CHECK(!ok && err.code == WH_E_CORRUPT && strstr(err.message, needle),
          "pos %u: expected corrupt with '%s', got %d '%s'", pos, needle, err.code, err.message);
    dest_free(&d);
}

static void test_bad_data(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_bad");
    wh_store_config_t c = config(uri, 6, 64);
    wh_store_t *st = open_store(&c);
    wh_err_t err = {0};
    bool leader;
    REQUIRE(wh_store_lead(st, &leader, &err) && leader, "%s", err.message);
    int64_t counter = 0;
    uint64_t g = fill_and_seal(st, 6, 4, &counter, 400);
    mongoc_client_t *rc = raw_client();
    char mname[128], cname[128];
    snprintf(mname, sizeof mname, "wirehead.gen.%llu.m", (unsigned long long)g);
    snprintf(cname, sizeof cname, "wirehead.gen.%llu", (unsigned long long)g);
    mongoc_collection_t *mc = mongoc_client_get_collection(rc, "t_bad", mname);
    mongoc_collection_t *cc = mongoc_client_get_collection(rc, "t_bad", cname);
    bson_error_t e;
    int64_t sid[6] = {0}, k[6] = {0}, z[6] = {0};
    uint8_t hdr[6][2048];
    uint32_t hlen[6] = {0};
    for (int p = 0; p < 6; p++) {
        bson_t *q = BCON_NEW("_id", BCON_INT32(p));
        mongoc_cursor_t *cur = mongoc_collection_find_with_opts(mc, q, NULL, NULL);
        const bson_t *doc;
        REQUIRE(mongoc_cursor_next(cur, &doc), "manifest %d", p);
        bson_iter_t it;
        REQUIRE(bson_iter_init_find(&it, doc, "s"), "s");
        sid[p] = bson_iter_as_int64(&it);
        REQUIRE(bson_iter_init_find(&it, doc, "k"), "k");
        k[p] = bson_iter_as_int64(&it);
        REQUIRE(bson_iter_init_find(&it, doc, "z"), "z");
        z[p] = bson_iter_as_int64(&it);
        REQUIRE(bson_iter_init_find(&it, doc, "h"), "h");
        const uint8_t *h;
        bson_iter_binary(&it, NULL, &hlen[p], &h);
        REQUIRE(hlen[p] <= sizeof hdr[p], "header size");
        memcpy(hdr[p], h, hlen[p]);
        mongoc_cursor_destroy(cur);
        bson_destroy(q);
    }
    /* pick samples that have at least 2 chunks */
    int usable[6], nu = 0;
    for (int p = 0; p < 6; p++)
        if (k[p] >= 2) usable[nu++] = p;
    REQUIRE(nu >= 4, "need 4 samples with 2+ chunks, have %d", nu);

    /* 1. a truncated chunk */
    {
        int p = usable[0];
        bson_t *q = BCON_NEW("_id", "{", "s", BCON_INT64(sid[p]), "c", BCON_INT64(0), "}");
        uint8_t few[10] = {0};
        bson_t *u = BCON_NEW("$set", "{", "d", BCON_BIN(BSON_SUBTYPE_BINARY, few, 10), "}");
        REQUIRE(mongoc_collection_update_one(cc, q, u, NULL, NULL, &e), "%s", e.message);
        expect_corrupt(st, g, (uint32_t)p, "chunk 0 holds 10 bytes");
        bson_destroy(q);
        bson_destroy(u);
    }
    /* 2. a manifest whose sizes disagree with its chunks */
    {
        int p = usable[1];
        bson_t *q = BCON_NEW("_id", BCON_INT32(p));
        bson_t *u = BCON_NEW("$set", "{", "k", BCON_INT64(k[p] + 1), "}");
        REQUIRE(mongoc_collection_update_one(mc, q, u, NULL, NULL, &e), "%s", e.message);
        expect_corrupt(st, g, (uint32_t)p, "chunks, sizes need");
        bson_destroy(u);
        u = BCON_NEW("$set", "{", "k", BCON_INT64(k[p]), "z", BCON_INT64(z[p] - 64), "}");
        REQUIRE(mongoc_collection_update_one(mc, q, u, NULL, NULL, &e), "%s", e.message);
        expect_corrupt(st, g, (uint32_t)p, "data bytes");
        bson_destroy(q);
        bson_destroy(u);
    }
    /* 3. a wrong dtype code (header hash recomputed so only the code is bad) */
    {
        int p = usable[2];
        uint8_t h[2048];
        memcpy(h, hdr[p], hlen[p]);
        h[WH_SAMPLE_HDR_SIZE + WH_SAMPLE_DESC_SIZE] = 99; /* field 1's dtype */
        uint64_t hh = header_hash(h, hlen[p]);
        memcpy(h + 32, &hh, 8);
        bson_t *q = BCON_NEW("_id", BCON_INT32(p));
        bson_t *u = BCON_NEW("$set", "{", "h", BCON_BIN(BSON_SUBTYPE_BINARY, h, hlen[p]), "}");
        REQUIRE(mongoc_collection_update_one(mc, q, u, NULL, NULL, &e), "%s", e.message);
        expect_corrupt(st, g, (uint32_t)p, "unknown dtype code 99");
        bson_destroy(q);
        bson_destroy(u);
    }
    /* 4. a missing chunk, and flipped data bytes (checksum) */
    {
        int p = usable[3];
        bson_t *q = BCON_NEW("_id", "{", "s", BCON_INT64(sid[p]), "c", BCON_INT64(1), "}");
        bson_t doc = BSON_INITIALIZER;
        mongoc_cursor_t *cur = mongoc_collection_find_with_opts(cc, q, NULL, NULL);
        const bson_t *d0;
        REQUIRE(mongoc_cursor_next(cur, &d0), "chunk 1");
        bson_copy_to(d0, &doc);
        mongoc_cursor_destroy(cur);
        REQUIRE(mongoc_collection_delete_one(cc, q, NULL, NULL, &e), "%s", e.message);
        expect_corrupt(st, g, (uint32_t)p, "chunks missing");
        /* put it back with one byte changed */
        bson_iter_t it;
        REQUIRE(bson_iter_init_find(&it, &doc, "d"), "d");
        const uint8_t *bytes;
        uint32_t blen;
        bson_iter_binary(&it, NULL, &blen, &bytes);
        uint8_t *mod = malloc(blen);
        memcpy(mod, bytes, blen);
        mod[0] ^= 0x40;
        bson_t *ins = BCON_NEW("_id", "{", "s", BCON_INT64(sid[p]), "c", BCON_INT64(1), "}", "d",
                               BCON_BIN(BSON_SUBTYPE_BINARY, mod, blen));
        REQUIRE(mongoc_collection_insert_one(cc, ins, NULL, NULL, &e), "%s", e.message);
        expect_corrupt(st, g, (uint32_t)p, "checksum mismatch");
        free(mod);
        bson_destroy(ins);
        bson_destroy(&doc);
        bson_destroy(q);
    }
    /* the untouched samples still read */
    dest_t d = {0};
    for (int p = 0; p < 6; p++) {
        bool touched = false;
        for (int i = 0; i < 4; i++) touched |= usable[i] == p;
        if (touched) continue;
        int64_t id[2];
        CHECK(read_check(st, g, (uint32_t)p, 400, &d, id, &err), "pos %d: %s", p, err.message);
    }
    dest_free(&d);
    mongoc_collection_destroy(mc);
    mongoc_collection_destroy(cc);
    mongoc_client_destroy(rc);
    wh_store_destroy(st);
}

static void test_schema_and_clean(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_schema");
    wh_store_config_t c = config(uri, 4, 1024);
    wh_store_t *st = open_store(&c);
    wh_err_t err = {0};
    wh_put_status_t ps;
    REQUIRE(put_sample(st, 5, 0, 10, &ps, &err), "%s", err.message);
    wh_store_config_t other = config(uri, 5, 1024);
    wh_err_clear(&err);
    CHECK(!wh_store_open(&other, &err) && err.code == WH_E_SCHEMA &&
              strstr(err.message, "SWAP_CAP=4"),
          "other SWAP_CAP refused: %d %s", err.code, err.message);
    const char *names[] = {"x", "y"};
    other = config(uri, 4, 1024);
    REQUIRE(wh_schema_init(&other.schema, 2, names, &err), "%s", err.message);
    wh_err_clear(&err);
    CHECK(!wh_store_open(&other, &err) && err.code == WH_E_SCHEMA &&
              strstr(err.message, "[id, data, mask]"),
          "other SAMPLE refused: %d %s", err.code, err.message);
    /* another prefix is another store, in the same database */
    other.prefix = "wirehead2";
    wh_store_t *st2 = wh_store_open(&other, &err);
    CHECK(st2 != NULL, "other prefix opens: %s", err.message);
    mongoc_client_t *rc = raw_client();
    mongoc_collection_t *unrelated = mongoc_client_get_collection(rc, "t_schema", "wirehead.other");
    bson_t *doc = BCON_NEW("x", BCON_INT32(1));
    bson_error_t e;
    REQUIRE(mongoc_collection_insert_one(unrelated, doc, NULL, NULL, &e), "%s", e.message);
    CHECK(count_prefix_collections(rc, "t_schema", "wirehead.") == 4,
          "state, gen, gen.m, other before clean");
    REQUIRE(wh_store_clean(&c, &err), "clean: %s", err.message);
    CHECK(count_prefix_collections(rc, "t_schema", "wirehead.") == 1,
          "clean dropped only the store's collections (wirehead.other stays)");
    CHECK(count_prefix_collections(rc, "t_schema", "wirehead2.") == 1,
          "another prefix's store stays");
    REQUIRE(wh_store_clean(&c, &err), "clean twice: %s", err.message);
    /* a handle keeps working after its store was cleaned: state recreated */
    REQUIRE(put_sample(st, 5, 1, 10, &ps, &err), "put after clean: %s", err.message);
    CHECK(ps == WH_PUT_ACCEPTED, "accepted after clean");
    bson_destroy(doc);
    mongoc_collection_destroy(unrelated);
    mongoc_client_destroy(rc);
    wh_store_destroy(st2);
    wh_store_destroy(st);
}

static void test_unreachable(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                getsockname(fd, (struct sockaddr *)&a, &len) == 0,
            "free port");
    close(fd); /* nothing listens there now */
    char uri[300];
    snprintf(uri, sizeof uri, "mongodb://alice:hunter2secret@127.0.0.1:%d/db?authSource=admin",
             ntohs(a.sin_port));
    wh_store_config_t c = config(uri, 4, 1024);
    c.connect_timeout_s = 1.0;
    wh_err_t err = {0};
    uint64_t t0 = wh_now_mono_ns();
    wh_store_t *st = wh_store_open(&c, &err);
    double took = (double)(wh_now_mono_ns() - t0) / 1e9;
    CHECK(!st && err.code == WH_E_UNAVAIL, "unreachable: %d %s", err.code, err.message);
    CHECK(took < 5.0, "bounded wait, took %.1f s", took);
    CHECK(!strstr(err.message, "hunter2") && !strstr(err.message, "alice"), "no credentials in: %s",
          err.message);
    char hostport[64];
    snprintf(hostport, sizeof hostport, "127.0.0.1:%d", ntohs(a.sin_port));
    CHECK(strstr(err.message, hostport) != NULL, "names the server: %s", err.message);
    if (st) wh_store_destroy(st);
}

/* ---- many writers, one manager, readers, at once ---- */

#define NW 4
#define NR 2
#define TARGET_SEALS 10
#define CAP 16

static char conc_uri[300];
static volatile int stop_all;
static volatile int seals_done;
static int thread_failures;

typedef struct {
    int id;
    long puts, accepted;
} wctx_t;

static void *writer(void *arg) {
    wctx_t *w = arg;
    wh_store_config_t c = config(conc_uri, CAP, 512);
    wh_store_t *st = open_store(&c);
    for (int64_t i = 0; !__atomic_load_n(&stop_all, __ATOMIC_ACQUIRE); i++) {
        wh_put_status_t ps;
        wh_err_t err = {0};
        if (!put_sample(st, 10 + w->id, i, 3000, &ps, &err)) {
            fprintf(stderr, "writer %d: %s\n", w->id, err.message);
            __atomic_fetch_add(&thread_failures, 1, __ATOMIC_RELAXED);
            break;
        }
        w->puts++;
        w->accepted += ps == WH_PUT_ACCEPTED;
    }
    wh_store_destroy(st);
    return NULL;
}

static int readers_ready;

static void *manager(void *arg) {
    WH_UNUSED(arg);
    wh_store_config_t c = config(conc_uri, CAP, 512);
    wh_store_t *st = open_store(&c);
    uint64_t deadline = wh_now_mono_ns() + 120ull * 1000000000ull;
    /* seal on until every reader has read 3 whole generations: under load a
     * reader can lose several races with reclamation in a row */
    while ((__atomic_load_n(&seals_done, __ATOMIC_ACQUIRE) < TARGET_SEALS + 3 ||
            __atomic_load_n(&readers_ready, __ATOMIC_ACQUIRE) < NR) &&
           __atomic_load_n(&seals_done, __ATOMIC_ACQUIRE) < 400 && wh_now_mono_ns() < deadline) {
        bool leader = false, sealed = false;
        wh_seal_info_t info;
        wh_err_t err = {0};
        if (!wh_store_lead(st, &leader, &err) || !leader ||
            !wh_store_seal(st, &sealed, &info, &err)) {
            fprintf(stderr, "manager: %s\n", err.message);
            __atomic_fetch_add(&thread_failures, 1, __ATOMIC_RELAXED);
            break;
        }
        if (sealed)
            __atomic_fetch_add(&seals_done, 1, __ATOMIC_RELEASE);
        else
            wh_sleep_ms(2);
    }
    wh_store_destroy(st);
    __atomic_store_n(&stop_all, 1, __ATOMIC_RELEASE);
    return NULL;
}

typedef struct {
    int id;
    long gens_read, samples, gone;
    /* ids seen per generation read, to check distinctness and no reuse */
    int64_t (*ids)[CAP][2];
    uint64_t *gen_of;
    int max_gens;
} rctx_t;

static void *reader(void *arg) {
    rctx_t *r = arg;
    wh_store_config_t c = config(conc_uri, CAP, 512);
    wh_store_t *st = open_store(&c);
    dest_t d = {0};
    uint64_t last = 0;
    while (!__atomic_load_n(&stop_all, __ATOMIC_ACQUIRE) && r->gens_read < r->max_gens) {
        uint64_t g = 0;
        wh_err_t err = {0};
        if (!wh_store_current(st, &g, &err)) {
            fprintf(stderr, "reader %d: %s\n", r->id, err.message);
            __atomic_fetch_add(&thread_failures, 1, __ATOMIC_RELAXED);
            break;
        }
        if (g == 0 || g == last) {
            wh_sleep_ms(2);
            continue;
        }
        last = g;
        int k = (int)r->gens_read;
        bool whole = true;
        for (uint32_t p = 0; p < CAP; p++) {
            int64_t id[2];
            if (!read_check(st, g, p, 3000, &d, id, &err)) {
                if (err.code == WH_E_GONE) { /* lost the race with reclamation */
                    r->gone++;
                    whole = false;
                    break;
                }
                fprintf(stderr, "reader %d: %s\n", r->id, err.message);
                __atomic_fetch_add(&thread_failures, 1, __ATOMIC_RELAXED);
                whole = false;
                break;
            }
            r->ids[k][p][0] = id[0];
            r->ids[k][p][1] = id[1];
            r->samples++;
        }
        if (whole) {
            r->gen_of[k] = g;
            if (++r->gens_read == 3) __atomic_fetch_add(&readers_ready, 1, __ATOMIC_RELEASE);
        }
    }
    dest_free(&d);
    wh_store_destroy(st);
    return NULL;
}

static void test_concurrent(void) {
    uri_for(conc_uri, sizeof conc_uri, "t_concurrent");
    pthread_t wt[NW], mt, rt[NR];
    wctx_t w[NW];
    rctx_t r[NR];
    stop_all = 0;
    seals_done = 0;
    readers_ready = 0;
    thread_failures = 0;
    for (int i = 0; i < NR; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].id = i;
        r[i].max_gens = 64;
        r[i].ids = calloc((size_t)r[i].max_gens, sizeof *r[i].ids);
        r[i].gen_of = calloc((size_t)r[i].max_gens, sizeof *r[i].gen_of);
        pthread_create(&rt[i], NULL, reader, &r[i]);
    }
    for (int i = 0; i < NW; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        pthread_create(&wt[i], NULL, writer, &w[i]);
    }
    pthread_create(&mt, NULL, manager, NULL);
    pthread_join(mt, NULL);
    for (int i = 0; i < NW; i++) pthread_join(wt[i], NULL);
    for (int i = 0; i < NR; i++) pthread_join(rt[i], NULL);
    CHECK(thread_failures == 0, "%d thread failures", thread_failures);
    CHECK(seals_done >= TARGET_SEALS, "only %d seals", seals_done);
    long acc = 0, puts = 0;
    for (int i = 0; i < NW; i++) {
        acc += w[i].accepted;
        puts += w[i].puts;
    }
    CHECK(acc >= (long)seals_done * CAP && acc <= (long)(seals_done + 1) * CAP,
          "accepted %ld for %d seals of %d", acc, seals_done, CAP);
    /* every generation read holds CAP distinct samples, and a sample is in
     * at most one generation */
    for (int i = 0; i < NR; i++) {
        CHECK(r[i].gens_read >= 3, "reader %d read %ld whole generations", i, r[i].gens_read);
        for (long a = 0; a < r[i].gens_read; a++) {
            for (int p = 0; p < CAP; p++)
                for (int q = p + 1; q < CAP; q++)
                    CHECK(memcmp(r[i].ids[a][p], r[i].ids[a][q], 16) != 0,
                          "gen %llu: positions %d and %d hold the same sample",
                          (unsigned long long)r[i].gen_of[a], p, q);
            for (long b = a + 1; b < r[i].gens_read; b++)
                for (int p = 0; p < CAP; p++)
                    for (int q = 0; q < CAP; q++)
                        CHECK(memcmp(r[i].ids[a][p], r[i].ids[b][q], 16) != 0,
                              "sample %lld/%lld in generations %llu and %llu",
                              (long long)r[i].ids[a][p][0], (long long)r[i].ids[a][p][1],
                              (unsigned long long)r[i].gen_of[a],
                              (unsigned long long)r[i].gen_of[b]);
        }
        printf("  reader %d: %ld generations, %ld samples verified, %ld gone\n", i, r[i].gens_read,
               r[i].samples, r[i].gone);
        free(r[i].ids);
        free(r[i].gen_of);
    }
    printf("  %d seals, %ld puts, %ld accepted\n", seals_done, puts, acc);
}

/* One sample larger than libmongoc's 48 MB reply limit: the chunk cursor's
 * batchSize keeps every reply under it. */
static void test_large_sample(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_large");
    wh_store_config_t c = config(uri, 1, 4u << 20);
    wh_store_t *st = open_store(&c);
    wh_err_t err = {0};
    int64_t n = 15 * 1000 * 1000; /* 60 MB of float32 */
    sample_t s;
    make_sample(&s, 7, 7, 0);
    free(s.data);
    s.n = n;
    s.data = malloc((size_t)n * 4);
    for (int64_t k = 0; k < n; k++) s.data[k] = (float)k;
    wh_array_t a[3];
    sample_arrays(&s, a);
    wh_put_status_t ps;
    uint64_t gen;
    REQUIRE(wh_store_put(st, a, 3, 0, &ps, &gen, &err), "put 60 MB: %s", err.message);
    bool leader;
    REQUIRE(wh_store_lead(st, &leader, &err) && leader, "%s", err.message);
    wh_seal_info_t info;
    REQUIRE(seal_now(st, &info), "seal");
    dest_t d = {0};
    wh_sample_meta_t meta;
    bool ok = wh_store_read(st, info.generation, 0, dest_fn, &d, &meta, &err);
    CHECK(ok, "read 60 MB: %s", err.message);
    if (ok) CHECK(memcmp(d.buf[1], s.data, (size_t)n * 4) == 0, "60 MB field intact");
    free_sample(&s);
    dest_free(&d);
    wh_store_destroy(st);
    wh_store_clean(&c, &err);
}

/* The relay's mirror (ext/read/wh_relay.c): a sealed generation copied into an
 * shm store reads back the same samples under the same number; a copier
 * that dies half way leaves the mirrored generation readable; a reclaimed
 * source generation and a second copier are refused with nothing changed. */
static void check_all(wh_store_t *st, uint64_t gen, uint32_t cap, int64_t first, dest_t *d) {
    wh_err_t err = {0};
    for (uint32_t p = 0; p < cap; p++) {
        int64_t id[2];
        CHECK(read_check(st, gen, p, 2000, d, id, &err) && id[0] == 9 && id[1] == first + p,
              "mirrored gen %llu pos %u: %s", (unsigned long long)gen, p, err.message);
    }
}

static void test_relay_mirror(void) {
    char uri[300], local[64];
    uri_for(uri, sizeof uri, "t_relay");
    snprintf(local, sizeof local, "shm://wh-ctest-relay-%d", (int)getpid());
    wh_store_config_t c = config(uri, 4, 512), lc = config(local, 4, 0);
    wh_store_t *src = open_store(&c), *dst = open_store(&lc);
    wh_err_t err = {0};
    bool leader;
    REQUIRE(wh_store_lead(src, &leader, &err) && leader, "%s", err.message);
    int64_t counter = 0;
    dest_t d = {0};
    uint64_t g1 = fill_and_seal(src, 4, 9, &counter, 2000);
    wh_relay_info_t info;
    REQUIRE(wh_relay_pull(src, dst, g1, 0, 5.0, &info, &err), "pull: %s", err.message);
    uint64_t cur = 0;
    CHECK(wh_store_current(dst, &cur, &err) && cur == g1 && info.samples == 4 && info.bytes > 0,
          "mirrored generation is the read generation: %llu", (unsigned long long)cur);
    check_all(dst, g1, 4, 0, &d);

    /* a copier killed after two of four positions */
    uint64_t g2 = fill_and_seal(src, 4, 9, &counter, 2000);
    REQUIRE(wh_store_resign(dst, &err), "%s", err.message); /* the child relays now */
    pid_t kid = fork();
    if (kid == 0) {
        wh_store_t *k = wh_store_open(&lc, &err);
        void *buf = NULL;
        if (!k || !wh_store_mirror_begin(k, g2, 0, &err)) _exit(3);
        for (uint32_t p = 0; p < 2; p++)
            if (!wh_store_mirror_reserve(k, g2, p, 64, &buf, &err) ||
                !wh_store_mirror_commit(k, g2, p, &err))
                _exit(4);
        _exit(0); /* no seal, no resign: as a SIGKILL leaves it */
    }
    int status = 0;
    waitpid(kid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child copier: %d", status);
    CHECK(wh_store_current(dst, &cur, &err) && cur == g1, "half a copy publishes nothing");
    check_all(dst, g1, 4, 0, &d);
    REQUIRE(wh_relay_pull(src, dst, g2, 0, 5.0, &info, &err), "resume: %s", err.message);
    check_all(dst, g2, 4, 4, &d);

    /* positions in order only; a second copier is refused */
    void *buf = NULL;
    wh_err_clear(&err);
    uint64_t g3 = fill_and_seal(src, 4, 9, &counter, 2000);
    CHECK(wh_store_mirror_begin(dst, g3, 0, &err) &&
              !wh_store_mirror_reserve(dst, g3, 1, 64, &buf, &err) && err.code == WH_E_INVALID,
          "out of order: %d %s", err.code, err.message);
    wh_store_t *other = open_store(&lc);
    wh_err_clear(&err);
    CHECK(!wh_relay_pull(src, other, g3, 0, 5.0, &info, &err) && err.code == WH_E_LEASE,
          "second copier refused: %d %s", err.code, err.message);
    wh_store_destroy(other);

    /* a source generation reclaimed before the copy: GONE, g2 still read */
    for (int k = 0; k < 3; k++) fill_and_seal(src, 4, 9, &counter, 2000);
    wh_err_clear(&err);
    CHECK(!wh_relay_pull(src, dst, g3, 0, 5.0, &info, &err) && err.code == WH_E_GONE,
          "reclaimed: %d %s", err.code, err.message);
    CHECK(wh_store_current(dst, &cur, &err) && cur == g2, "still the last mirrored");
    check_all(dst, g2, 4, 4, &d);
    dest_free(&d);
    wh_store_destroy(dst);
    wh_store_destroy(src);
    REQUIRE(wh_store_clean(&lc, &err), "%s", err.message);
}

/* What can be a relay's source or copy is what the backends' tables say,
 * never the URI's spelling: a source written mongodb+srv:// is pulled from
 * like a mongodb:// one (here the handle's URI is respelled: the test
 * server has no SRV record), and a source or copy of a backend that cannot
 * be one is refused naming its backend, nothing copied. */
static void test_relay_backends(void) {
    char uri[300], srv[320], local[64];
    uri_for(uri, sizeof uri, "t_relay_srv");
    snprintf(srv, sizeof srv, "mongodb+srv://%s", strstr(uri, "://") + 3);
    snprintf(local, sizeof local, "shm://wh-ctest-relay-srv-%d", (int)getpid());
    wh_store_config_t c = config(uri, 4, 512), lc = config(local, 4, 0);
    wh_store_t *src = open_store(&c), *dst = open_store(&lc);
    wh_err_t err = {0};
    bool leader;
    REQUIRE(wh_store_lead(src, &leader, &err) && leader, "%s", err.message);
    int64_t counter = 0;
    dest_t d = {0};
    uint64_t g1 = fill_and_seal(src, 4, 9, &counter, 2000);
    const char *spelled = src->cfg.uri;
    src->cfg.uri = srv;
    wh_relay_info_t info;
    CHECK(wh_relay_pull(src, dst, g1, 0, 5.0, &info, &err), "pull from %s: %s", srv, err.message);
    src->cfg.uri = spelled;
    check_all(dst, g1, 4, 0, &d);
    uint64_t g2 = fill_and_seal(src, 4, 9, &counter, 2000), cur = 0;
    wh_err_clear(&err);
    CHECK(!wh_relay_pull(dst, src, g1, 0, 5.0, &info, &err) && err.code == WH_E_INVALID &&
              strstr(err.message, "the shm backend has none"),
          "an shm source: %d %s", err.code, err.message);
    wh_err_clear(&err);
    CHECK(!wh_relay_pull(src, src, g2, 0, 5.0, &info, &err) && err.code == WH_E_INVALID &&
              strstr(err.message, "the mongodb backend has none"),
          "a mongodb copy: %d %s", err.code, err.message);
    CHECK(wh_store_current(dst, &cur, &err) && cur == g1, "nothing copied: %llu",
          (unsigned long long)cur);
    dest_free(&d);
    wh_store_destroy(dst);
    wh_store_destroy(src);
    REQUIRE(wh_store_clean(&lc, &err), "%s", err.message);
    REQUIRE(wh_store_clean(&c, &err), "%s", err.message);
}

/* ---- spec mode (docs/reproducible.md) ---- */

static wh_store_config_t spec_config(const char *uri, uint32_t cap, uint64_t seed) {
    wh_store_config_t c = config(uri, cap, 96); /* small chunks: samples span several */
    c.spec = true;
    c.run_seed = seed;
    return c;
}

/* Sample index k's bytes: a function of k (variant 1: other bytes). */
static bool spec_put(wh_store_t *st, const wh_claim_t *cl, int variant, wh_spec_put_t *ps,
                     bool *sealed, wh_err_t *err) {
    sample_t s;
    wh_array_t a[3];
    make_sample(&s, 7000 + variant, (int64_t)cl->index, 300);
    sample_arrays(&s, a);
    bool ok = wh_store_spec_put(st, cl, a, 3, ps, sealed, err);
    free_sample(&s);
    return ok;
}

static wh_claim_status_t spec_claim(wh_store_t *st, double lease_s, uint32_t attempts,
                                    wh_claim_t *cl) {
    wh_err_t err = {0};
    wh_claim_status_t cs = WH_CLAIM_WAIT;
    REQUIRE(wh_store_spec_claim(st, lease_s, attempts, cl, &cs, &err), "claim: %s", err.message);
    return cs;
}

/* Claims until a claim is given (WAIT: again), up to timeout_s. */
static wh_claim_status_t spec_claim_wait(wh_store_t *st, double lease_s, uint32_t attempts,
                                         wh_claim_t *cl, double timeout_s) {
    uint64_t t0 = wh_now_mono_ns();
    wh_claim_status_t cs;
    while ((cs = spec_claim(st, lease_s, attempts, cl)) == WH_CLAIM_WAIT &&
           wh_now_mono_ns() - t0 < (uint64_t)(timeout_s * 1e9))
        wh_sleep_ms(20);
    return cs;
}

static void spec_put_ok(wh_store_t *st, const wh_claim_t *cl, bool want_sealed) {
    wh_err_t err = {0};
    wh_spec_put_t ps = WH_SPEC_PUT_GONE;
    bool sealed = !want_sealed;
    REQUIRE(spec_put(st, cl, 0, &ps, &sealed, &err), "put %llu: %s", (unsigned long long)cl->index,
            err.message);
    CHECK(ps == WH_SPEC_PUT_ACCEPTED && sealed == want_sealed, "put %llu: status %d sealed %d",
          (unsigned long long)cl->index, ps, sealed);
}

static uint64_t spec_locate(wh_store_t *st, uint64_t s) {
    wh_err_t err = {0};
    uint64_t g = 0;
    REQUIRE(wh_store_spec_locate(st, s, &g, &err), "locate %llu: %s", (unsigned long long)s,
            err.message);
    return g;
}

/* Every position of spec generation s holds index s*cap+pos, byte for byte. */
static void spec_check_gen(wh_store_t *st, uint64_t s, uint32_t cap) {
    uint64_t g = spec_locate(st, s);
    CHECK(g != 0, "spec generation %llu is sealed", (unsigned long long)s);
    dest_t d = {0};
    for (uint32_t p = 0; g && p < cap; p++) {
        wh_err_t err = {0};
        int64_t id[2] = {0, 0};
        CHECK(read_check(st, g, p, 300, &d, id, &err) && id[0] == 7000 &&
                  id[1] == (int64_t)(s * cap + p),
              "spec generation %llu position %u: %s (holds %lld/%lld)", (unsigned long long)s, p,
              err.message, (long long)id[0], (long long)id[1]);
    }
    dest_free(&d);
}

/* Indices in order, each at its position; a put of the last seals; a
 * position's first put wins and the later ones are counted by their bytes;
 * a generation's params are the version in force when it was opened. */
static void test_spec_claims_and_puts(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_claims");
    wh_store_config_t c = spec_config(uri, 3, 7);
    wh_store_t *a = open_store(&c), *b = open_store(&c);
    wh_err_t err = {0};
    uint64_t v1 = 0, v2 = 0;
    REQUIRE(wh_store_params_set(a, "{\"lr\": 1}", 9, &v1, &err), "%s", err.message);
    wh_claim_t cl[4];
    for (int i = 0; i < 3; i++) {
        REQUIRE(spec_claim(a, 30, 3, &cl[i]) == WH_CLAIM_OK, "claim %d", i);
        CHECK(cl[i].index == (uint64_t)i && cl[i].spec_gen == 0 && cl[i].pos == (uint32_t)i &&
                  cl[i].attempt == 1 && cl[i].params_version == v1 && cl[i].gen == cl[0].gen &&
                  cl[i].gen != 0,
              "claim %d: index %llu gen %llu pos %u attempt %u pv %llu", i,
              (unsigned long long)cl[i].index, (unsigned long long)cl[i].spec_gen, cl[i].pos,
              cl[i].attempt, (unsigned long long)cl[i].params_version);
    }
    CHECK(cl[0].token != cl[1].token && cl[1].token != cl[2].token, "claims have their own token");
    CHECK(spec_claim(b, 30, 3, &cl[3]) == WH_CLAIM_WAIT, "every index is with a live claimer");

    char *doc = NULL;
    size_t len = 0;
    REQUIRE(wh_store_params_set(a, "{\"lr\": 2}", 9, &v2, &err), "%s", err.message);
    REQUIRE(wh_store_spec_params(b, &cl[0], &doc, &len, &err), "%s", err.message);
    CHECK(len == 9 && strcmp(doc, "{\"lr\": 1}") == 0, "the generation's own params: %s", doc);
    free(doc);

    spec_put_ok(a, &cl[1], false);
    wh_spec_put_t ps = WH_SPEC_PUT_GONE;
    bool sealed = false;
    REQUIRE(spec_put(b, &cl[1], 0, &ps, &sealed, &err), "%s", err.message);
    CHECK(ps == WH_SPEC_PUT_SAME, "the same bytes again: %d", ps);
    REQUIRE(spec_put(b, &cl[1], 1, &ps, &sealed, &err), "%s", err.message);
    CHECK(ps == WH_SPEC_PUT_DIFFERENT, "other bytes: %d", ps);
    wh_spec_status_t ss;
    REQUIRE(wh_store_spec_status(b, &ss, &err), "%s", err.message);
    CHECK(ss.spec && ss.run_seed == 7 && ss.open && ss.open_gen == 0 && ss.open_fill == 1 &&
              !ss.any_sealed && ss.duplicates == 2 && ss.nondeterministic == 1 && ss.nclaims == 2 &&
              ss.claims[0].attempt == 1 && ss.claims[0].pid == (uint64_t)getpid(),
          "status: open %d gen %llu fill %u dup %llu nondet %llu claims %d", ss.open,
          (unsigned long long)ss.open_gen, ss.open_fill, (unsigned long long)ss.duplicates,
          (unsigned long long)ss.nondeterministic, ss.nclaims);

    spec_put_ok(a, &cl[0], false);
    CHECK(spec_locate(b, 0) == 0, "not sealed before its last put");
    spec_put_ok(a, &cl[2], true);
    spec_check_gen(b, 0, 3);
    bool mine = true;
    REQUIRE(wh_store_spec_renew(a, &cl[0], 30, &mine, &err), "%s", err.message);
    CHECK(!mine, "a claim whose sample is committed is no one's");

    REQUIRE(spec_claim(b, 30, 3, &cl[3]) == WH_CLAIM_OK, "the next generation opens");
    CHECK(cl[3].index == 3 && cl[3].spec_gen == 1 && cl[3].pos == 0 && cl[3].gen > cl[0].gen &&
              cl[3].params_version == v2,
          "index %llu gen %llu pv %llu", (unsigned long long)cl[3].index,
          (unsigned long long)cl[3].gen, (unsigned long long)cl[3].params_version);
    REQUIRE(wh_store_spec_renew(b, &cl[3], 30, &mine, &err) && mine, "renew: %s", err.message);
    REQUIRE(wh_store_spec_status(a, &ss, &err), "%s", err.message);
    CHECK(ss.any_sealed && ss.last_sealed == 0 && ss.open && ss.open_gen == 1,
          "status after the seal");
    wh_store_destroy(a);
    wh_store_destroy(b);
}

typedef struct {
    const char *uri;
    uint64_t got[64];
    int n, sealed, bad;
    char why[WH_ERR_LEN];
} spec_worker_t;

static void *spec_worker(void *arg) {
    spec_worker_t *w = arg;
    wh_store_config_t c = spec_config(w->uri, 4, 11);
    wh_err_t err = {0};
    wh_store_t *st = wh_store_open(&c, &err);
    for (; st;) {
        wh_claim_t cl;
        wh_claim_status_t cs;
        if (!wh_store_spec_claim(st, 30, 3, &cl, &cs, &err)) break;
        if (cs == WH_CLAIM_AHEAD) break; /* none open and the window full: all sealed */
        if (cs == WH_CLAIM_WAIT) {
            wh_sleep_ms(2);
            continue;
        }
        if (w->n < 64) w->got[w->n++] = cl.index;
        wh_spec_put_t ps;
        bool sealed = false;
        if (!spec_put(st, &cl, 0, &ps, &sealed, &err)) break;
        w->bad += ps != WH_SPEC_PUT_ACCEPTED || cl.attempt != 1;
        w->sealed += sealed;
    }
    if (err.code) snprintf(w->why, sizeof w->why, "%s", err.message);
    if (!st) w->bad++;
    wh_store_destroy(st);
    return NULL;
}

/* A claimer killed between handing out a position and writing its claim
 * leaves a hole; once the counter is spent, the next claim takes it. */
static void test_spec_claim_hole(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_hole");
    wh_store_config_t c = spec_config(uri, 3, 17);
    wh_store_t *a = open_store(&c);
    wh_claim_t cl;
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK && cl.index == 0, "claim 0");
    mongoc_client_t *rc = raw_client();
    char coll[128];
    snprintf(coll, sizeof coll, "wirehead.gen.%llu.c", (unsigned long long)cl.gen);
    mongoc_collection_t *col = mongoc_client_get_collection(rc, "t_spec_hole", coll);
    bson_t *q = BCON_NEW("_id", BCON_UTF8("next"));
    bson_t *u = BCON_NEW("$inc", "{", "n", BCON_INT64(1), "}");
    bson_error_t e;
    REQUIRE(mongoc_collection_update_one(col, q, u, NULL, NULL, &e), "%s", e.message);
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK, "claim");
    CHECK(cl.index == 2, "the counter's next: %llu", (unsigned long long)cl.index);
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK, "claim the hole");
    CHECK(cl.index == 1 && cl.attempt == 1, "the hole: %llu attempt %u",
          (unsigned long long)cl.index, cl.attempt);
    CHECK(spec_claim(a, 30, 3, &cl) == WH_CLAIM_WAIT, "then nothing");
    bson_destroy(q);
    bson_destroy(u);
    mongoc_collection_destroy(col);
    mongoc_client_destroy(rc);
    wh_store_destroy(a);
}

/* Claimers racing on one store never get the same index: three handles
 * claim and put until the window is full; every index is claimed once. */
static void test_spec_concurrent_claims(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_race");
    spec_worker_t w[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].uri = uri;
        REQUIRE(pthread_create(&t[i], NULL, spec_worker, &w[i]) == 0, "thread");
    }
    int times[16] = {0}, sealed = 0, total = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(!w[i].bad && !w[i].why[0], "worker %d: %d bad, error '%s'", i, w[i].bad, w[i].why);
        sealed += w[i].sealed;
        for (int k = 0; k < w[i].n; k++, total++)
            if (w[i].got[k] < 16) times[w[i].got[k]]++;
    }
    CHECK(total == 16 && sealed == 4, "16 claims and 4 seals, got %d and %d", total, sealed);
    for (int k = 0; k < 16; k++) CHECK(times[k] == 1, "index %d claimed %d times", k, times[k]);
    wh_store_config_t c = spec_config(uri, 4, 11);
    wh_store_t *st = open_store(&c);
    for (uint64_t s = 0; s < 4; s++) spec_check_gen(st, s, 4);
    wh_store_destroy(st);
}

/* A claim not renewed within its lease is taken over with attempt + 1 (and
 * at once when its claimer's pid is gone on this node); the first complete
 * put of a position still wins, whoever holds the claim. */
static void test_spec_takeover(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_takeover");
    wh_store_config_t c = spec_config(uri, 2, 3);
    wh_store_t *a = open_store(&c), *b = open_store(&c);
    wh_err_t err = {0};
    wh_claim_t ca, cb, cb2;
    REQUIRE(spec_claim(a, 0.4, 3, &ca) == WH_CLAIM_OK && ca.index == 0, "a claims 0");
    uint64_t t0 = wh_now_mono_ns();
    REQUIRE(spec_claim(b, 30, 3, &cb) == WH_CLAIM_OK && cb.index == 1 && cb.attempt == 1,
            "b claims 1 while 0 is a's");
    REQUIRE(spec_claim_wait(b, 30, 3, &cb2, 10) == WH_CLAIM_OK, "b takes 0 over");
    CHECK(cb2.index == 0 && cb2.attempt == 2 && cb2.token != ca.token, "index %llu attempt %u",
          (unsigned long long)cb2.index, cb2.attempt);
    CHECK(wh_now_mono_ns() - t0 >= 300000000ull, "not before a's lease ran out");
    bool mine = true;
    REQUIRE(wh_store_spec_renew(a, &ca, 0.4, &mine, &err), "%s", err.message);
    CHECK(!mine, "a's claim is b's now");
    spec_put_ok(a, &ca, false); /* a's late put is the first complete one */
    wh_spec_put_t ps;
    bool sealed = true;
    REQUIRE(spec_put(b, &cb2, 0, &ps, &sealed, &err), "%s", err.message);
    CHECK(ps == WH_SPEC_PUT_SAME && !sealed, "b's put of 0 comes second: %d", ps);
    spec_put_ok(b, &cb, true);

    /* a claimer on this node that died: its index is taken at once */
    int fd[2];
    REQUIRE(pipe(fd) == 0, "pipe");
    pid_t kid = fork();
    if (kid == 0) {
        wh_store_t *k = wh_store_open(&c, &err);
        wh_claim_t kc;
        wh_claim_status_t cs;
        if (!k || !wh_store_spec_claim(k, 30, 3, &kc, &cs, &err) || cs != WH_CLAIM_OK) _exit(3);
        ssize_t wr = write(fd[1], &kc.index, sizeof kc.index);
        _exit(wr == sizeof kc.index ? 0 : 4); /* no put, no fail: as a SIGKILL leaves it */
    }
    int status = 0;
    waitpid(kid, &status, 0);
    uint64_t theirs = 99;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
              read(fd[0], &theirs, sizeof theirs) == sizeof theirs && theirs == 2,
          "child claimed: %d, index %llu", status, (unsigned long long)theirs);
    close(fd[0]);
    close(fd[1]);
    REQUIRE(spec_claim(b, 30, 3, &cb) == WH_CLAIM_OK, "the dead claimer's index at once");
    CHECK(cb.index == 2 && cb.attempt == 2, "index %llu attempt %u", (unsigned long long)cb.index,
          cb.attempt);
    wh_store_destroy(a);
    wh_store_destroy(b);
}

/* An index fails for good at SPEC_ATTEMPTS: claims of its generation and
 * locates of it say which, where and why; so does an expired last attempt. */
static void test_spec_fail(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_fail");
    wh_store_config_t c = spec_config(uri, 2, 5);
    wh_store_t *a = open_store(&c);
    wh_err_t err = {0};
    wh_claim_t cl;
    bool failed = true;
    REQUIRE(spec_claim(a, 30, 2, &cl) == WH_CLAIM_OK && cl.index == 0, "claim 0");
    REQUIRE(wh_store_spec_fail(a, &cl, 2, "ValueError: bad shape", &failed, &err), "%s",
            err.message);
    CHECK(!failed, "one attempt of two");
    REQUIRE(spec_claim(a, 30, 2, &cl) == WH_CLAIM_OK, "claim again");
    CHECK(cl.index == 0 && cl.attempt == 2, "the freed index first, attempt 2: %llu %u",
          (unsigned long long)cl.index, cl.attempt);
    REQUIRE(wh_store_spec_fail(a, &cl, 2, "ValueError: bad shape", &failed, &err), "%s",
            err.message);
    CHECK(failed, "failed for good at the second attempt");
    char host[64], want[WH_ERR_LEN];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    snprintf(want, sizeof want,
             "sample index 0 (generation 0, position 0) failed 2 attempts; last by pid %d on "
             "host %s: ValueError: bad shape",
             (int)getpid(), host);
    wh_claim_status_t cs;
    wh_err_clear(&err);
    CHECK(!wh_store_spec_claim(a, 30, 2, &cl, &cs, &err) && err.code == WH_E_SPECFAIL &&
              strcmp(err.message, want) == 0,
          "claim: %d %s", err.code, err.message);
    uint64_t g = 0;
    wh_err_clear(&err);
    CHECK(!wh_store_spec_locate(a, 0, &g, &err) && err.code == WH_E_SPECFAIL &&
              strcmp(err.message, want) == 0,
          "locate: %d %s", err.code, err.message);
    wh_spec_status_t ss;
    REQUIRE(wh_store_spec_status(a, &ss, &err), "%s", err.message);
    CHECK(ss.failed && strcmp(ss.failure, want) == 0, "status: %s", ss.failure);
    wh_store_destroy(a);

    /* the last attempt's lease runs out */
    uri_for(uri, sizeof uri, "t_spec_fail_lease");
    c = spec_config(uri, 2, 5);
    a = open_store(&c);
    wh_store_t *b = open_store(&c);
    REQUIRE(spec_claim(a, 0.2, 1, &cl) == WH_CLAIM_OK && cl.index == 0, "claim 0");
    REQUIRE(spec_claim(b, 30, 1, &cl) == WH_CLAIM_OK && cl.index == 1, "claim 1");
    uint64_t t0 = wh_now_mono_ns();
    bool ok = true;
    wh_err_clear(&err);
    while (ok && wh_now_mono_ns() - t0 < 10000000000ull) {
        ok = wh_store_spec_claim(b, 30, 1, &cl, &cs, &err);
        CHECK(!ok || cs == WH_CLAIM_WAIT, "nothing else to claim: %d", cs);
        if (ok) wh_sleep_ms(20);
    }
    CHECK(!ok && err.code == WH_E_SPECFAIL &&
              strstr(err.message, "sample index 0 (generation 0, position 0) failed 1 attempts") &&
              strstr(err.message, "whose claim expired after 0.2s"),
          "expired: %d %s", err.code, err.message);
    wh_store_destroy(a);
    wh_store_destroy(b);

    /* the last attempt's claimer dies on this node */
    uri_for(uri, sizeof uri, "t_spec_fail_dead");
    c = spec_config(uri, 2, 5);
    a = open_store(&c);
    pid_t kid = fork();
    if (kid == 0) {
        wh_store_t *k = wh_store_open(&c, &err);
        _exit(k && wh_store_spec_claim(k, 30, 1, &cl, &cs, &err) && cs == WH_CLAIM_OK ? 0 : 3);
    }
    int status = 0;
    waitpid(kid, &status, 0);
    REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child claimed: %d", status);
    snprintf(want, sizeof want,
             "sample index 0 (generation 0, position 0) failed 1 attempts; last by pid %d on "
             "host %s, which died holding it",
             (int)kid, host);
    wh_err_clear(&err);
    CHECK(!wh_store_spec_claim(a, 30, 1, &cl, &cs, &err) && err.code == WH_E_SPECFAIL &&
              strcmp(err.message, want) == 0,
          "died: %d %s", err.code, err.message);
    wh_store_destroy(a);
}

/* Generators stay within SPEC_AHEAD generations of the slowest reader's
 * need, and what the window leaves is reclaimed; a reader that moves back
 * gets its generation made again; a manager's seal on a spec store seals
 * nothing early and drops nothing. */
static void test_spec_window(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_window");
    wh_store_config_t c = spec_config(uri, 2, 9);
    wh_store_t *a = open_store(&c), *r = open_store(&c);
    wh_err_t err = {0};
    mongoc_client_t *rc = raw_client();
    REQUIRE(wh_store_spec_need(r, 0, &err), "%s", err.message);
    wh_claim_t cl;
    for (uint64_t k = 0; k < 2 * WH_SPEC_AHEAD; k++) {
        REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK && cl.index == k, "claim %llu",
                (unsigned long long)k);
        spec_put_ok(a, &cl, k % 2 == 1);
    }
    CHECK(spec_claim(a, 30, 3, &cl) == WH_CLAIM_AHEAD, "stops at %d generations ahead",
          WH_SPEC_AHEAD);
    wh_spec_status_t ss;
    REQUIRE(wh_store_spec_status(a, &ss, &err), "%s", err.message);
    CHECK(ss.reader && ss.slowest == 0 && ss.slowest_pid == (uint64_t)getpid() && ss.floor == 0 &&
              !ss.open && ss.last_sealed == 3,
          "status: reader %d slowest %llu floor %llu", ss.reader, (unsigned long long)ss.slowest,
          (unsigned long long)ss.floor);
    uint64_t g0 = spec_locate(r, 0);

    /* a manager's seal: nothing is full, nothing goes */
    bool leader = false, sealed = true;
    wh_seal_info_t info;
    REQUIRE(wh_store_lead(a, &leader, &err) && leader, "%s", err.message);
    REQUIRE(wh_store_seal(a, &sealed, &info, &err), "%s", err.message);
    CHECK(!sealed, "a manager seals nothing early");
    for (uint64_t s = 0; s < WH_SPEC_AHEAD; s++) spec_check_gen(r, s, 2);

    REQUIRE(wh_store_spec_need(r, 1, &err), "%s", err.message);
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK, "the need moved: claims resume");
    CHECK(cl.index == 2 * WH_SPEC_AHEAD && cl.spec_gen == WH_SPEC_AHEAD, "index %llu",
          (unsigned long long)cl.index);
    CHECK(spec_locate(r, 0) == 0, "spec generation 0 left the window");
    dest_t d = {0};
    wh_err_clear(&err);
    CHECK(!wh_store_read(r, g0, 0, dest_fn, &d, NULL, &err) && err.code == WH_E_GONE,
          "its generation is reclaimed: %d %s", err.code, err.message);
    /* the window (1..4) and the state: its 4 generations' collections */
    int n = count_prefix_collections(rc, "t_spec_window", "wirehead.gen.");
    CHECK(n <= 3 * WH_SPEC_AHEAD, "bounded storage: %d generation collections", n);

    /* a reader resumed far back: the open generation is abandoned, the
     * needed one made again, a put into the abandoned one dropped */
    REQUIRE(wh_store_spec_need(r, 0, &err), "%s", err.message);
    wh_claim_t again;
    REQUIRE(spec_claim(a, 30, 3, &again) == WH_CLAIM_OK, "claim after the need moved back");
    CHECK(again.spec_gen == 0 && again.index == 0 && again.attempt == 1 && again.gen > cl.gen,
          "spec generation 0 again, in a new generation: index %llu gen %llu",
          (unsigned long long)again.index, (unsigned long long)again.gen);
    wh_spec_put_t ps;
    REQUIRE(spec_put(a, &cl, 0, &ps, &sealed, &err), "%s", err.message);
    CHECK(ps == WH_SPEC_PUT_GONE, "a put into the abandoned generation: %d", ps);
    spec_put_ok(a, &again, false);
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK && cl.index == 1, "claim 1");
    spec_put_ok(a, &cl, true);
    spec_check_gen(r, 0, 2);
    dest_free(&d);
    mongoc_client_destroy(rc);
    wh_store_destroy(a);
    wh_store_destroy(r);
}

/* A spec store and its RUN_SEED: every opener's config must agree; a
 * freshest store refuses spec openers; put and spec_put stay apart. */
static void test_spec_seed(void) {
    char uri[300], plain_uri[300];
    uri_for(uri, sizeof uri, "t_spec_seed");
    uri_for(plain_uri, sizeof plain_uri, "t_spec_plain");
    wh_store_config_t c7 = spec_config(uri, 2, 7), c8 = spec_config(uri, 2, 8);
    wh_store_config_t plain = config(uri, 2, 96);
    wh_store_t *a = open_store(&c7);
    wh_err_t err = {0};
    CHECK(!wh_store_open(&c8, &err) && err.code == WH_E_SCHEMA &&
              strstr(err.message, "t_spec_seed (collection prefix 'wirehead') was created with "
                                  "RUN_SEED=7; this config has RUN_SEED=8 (two runs never share "
                                  "a store: clean it or name another STORE)"),
          "another seed: %d %s", err.code, err.message);
    wh_err_clear(&err);
    CHECK(!wh_store_open(&plain, &err) && err.code == WH_E_SCHEMA &&
              strstr(err.message,
                     "was created with RUN_SEED=7 (spec mode); this config has no RUN_SEED"),
          "no seed: %d %s", err.code, err.message);
    wh_put_status_t ps;
    wh_err_clear(&err);
    CHECK(!put_sample(a, 1, 1, 10, &ps, &err) && err.code == WH_E_INVALID &&
              strstr(err.message, "spec mode"),
          "put on a spec store: %d %s", err.code, err.message);
    wh_store_destroy(a);

    plain.uri = plain_uri;
    wh_store_t *p = open_store(&plain);
    wh_store_config_t c8p = spec_config(plain_uri, 2, 8);
    wh_err_clear(&err);
    CHECK(!wh_store_open(&c8p, &err) && err.code == WH_E_SCHEMA &&
              strstr(err.message, "was created without RUN_SEED (freshest mode); this config "
                                  "sets RUN_SEED=8"),
          "a freshest store: %d %s", err.code, err.message);
    wh_claim_t cl;
    wh_claim_status_t cs;
    wh_err_clear(&err);
    CHECK(!wh_store_spec_claim(p, 30, 3, &cl, &cs, &err) && err.code == WH_E_INVALID,
          "claim on a freshest handle: %d %s", err.code, err.message);
    wh_spec_status_t ss;
    CHECK(wh_store_spec_status(p, &ss, &err) && !ss.spec, "status of a freshest store");
    REQUIRE(put_sample(p, 1, 1, 10, &ps, &err) && ps == WH_PUT_ACCEPTED, "%s", err.message);
    wh_store_destroy(p);
}

/* The put of a generation's last position killed between its commit and
 * the seal: the next claim seals it first. */
static void test_spec_commit_kill(void) {
    char uri[300];
    uri_for(uri, sizeof uri, "t_spec_kill");
    wh_store_config_t c = spec_config(uri, 2, 13);
    wh_store_t *a = open_store(&c);
    wh_claim_t cl;
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK && cl.index == 0, "claim 0");
    spec_put_ok(a, &cl, false);
    pid_t kid = fork();
    if (kid == 0) {
        setenv("WIREHEAD_FAULT_SPEC_COMMIT_KILL", "1", 1);
        wh_err_t err = {0};
        wh_store_t *k = wh_store_open(&c, &err);
        wh_claim_t kc;
        wh_claim_status_t cs;
        wh_spec_put_t ps;
        bool sealed;
        if (!k || !wh_store_spec_claim(k, 30, 3, &kc, &cs, &err) || cs != WH_CLAIM_OK ||
            kc.index != 1)
            _exit(3);
        spec_put(k, &kc, 0, &ps, &sealed, &err);
        _exit(4); /* the fault point kills it first */
    }
    int status = 0;
    waitpid(kid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "killed after its commit: %d",
          status);
    CHECK(spec_locate(a, 0) == 0, "committed, not sealed");
    REQUIRE(spec_claim(a, 30, 3, &cl) == WH_CLAIM_OK, "the next claim");
    CHECK(cl.index == 2 && cl.spec_gen == 1, "sealed 0 and opened 1: index %llu",
          (unsigned long long)cl.index);
    spec_check_gen(a, 0, 2);
    wh_store_destroy(a);
}

int main(void) {
    const char *env = getenv("WH_MONGO_URI");
    signal(SIGPIPE, SIG_IGN);
    mongoc_init();
    if (env && *env)
        snprintf(base_uri, sizeof base_uri, "%s", env);
    else
        start_server();
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"roundtrip_and_straddling_chunks", test_roundtrip_and_straddling_chunks},
        {"lease", test_lease},
        {"hole_repair", test_hole_repair},
        {"bounded_and_gone", test_bounded_and_gone},
        {"bad_data", test_bad_data},
        {"schema_and_clean", test_schema_and_clean},
        {"unreachable", test_unreachable},
        {"concurrent", test_concurrent},
        {"large_sample", test_large_sample},
        {"relay_mirror", test_relay_mirror},
        {"relay_backends", test_relay_backends},
        {"spec_claims_and_puts", test_spec_claims_and_puts},
        {"spec_claim_hole", test_spec_claim_hole},
        {"spec_concurrent_claims", test_spec_concurrent_claims},
        {"spec_takeover", test_spec_takeover},
        {"spec_fail", test_spec_fail},
        {"spec_window", test_spec_window},
        {"spec_seed", test_spec_seed},
        {"spec_commit_kill", test_spec_commit_kill},
    };
    const char *only = getenv("WH_TEST_ONLY");
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (only && *only && !strstr(tests[i].name, only)) continue;
        int before = failures;
        uint64_t t0 = wh_now_mono_ns();
        tests[i].fn();
        printf("%s %s (%.2f s)\n", failures == before ? "ok  " : "FAIL", tests[i].name,
               (double)(wh_now_mono_ns() - t0) / 1e9);
        fflush(stdout);
    }
    stop_server();
    mongoc_cleanup();
    printf(failures ? "%d failures\n" : "all mongo store tests passed\n", failures);
    return failures ? 1 : 0;
}
