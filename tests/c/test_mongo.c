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
