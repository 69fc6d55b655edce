/* Throughput of the MongoDB store against raw libmongoc, for
 * benchmarks/bench_mongo.py.
 *
 *   bench_mongo raw|raw-index|store URI DB SAMPLE_BYTES CHUNK_BYTES N_SAMPLES
 *
 * raw: the sample bytes as {_id:{s,c}, d:<binary>} chunk documents written
 * with insert_many and read back with a batchSize'd find into one reused
 * buffer: the same documents the store writes, without its protocol (no
 * encode and checksums, manifest, counter, state or seal).
 * raw-index: raw plus one small document per sample, inserted after its
 * chunks and looked up before them: the least a store that can find its
 * samples by position must do.
 * store: wh_store_put of a one-field uint8 sample of SAMPLE_BYTES, a seal,
 * then wh_store_read of every position into one reused buffer (checksums
 * verified, as by default).
 *
 * Both print one JSON line: {"write_s": .., "read_s": .., "bytes": ..}
 * where bytes is the payload moved each way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mongoc/mongoc.h>

#include "wh_store.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const bson_error_t *e) {
    fprintf(stderr, "bench_mongo_raw: %s: %s\n", what, e ? e->message : "");
    exit(1);
}

static void append_id(bson_t *parent, const char *key, int64_t s, int64_t c) {
    bson_t id;
    BSON_APPEND_DOCUMENT_BEGIN(parent, key, &id);
    BSON_APPEND_INT64(&id, "s", s);
    BSON_APPEND_INT64(&id, "c", c);
    bson_append_document_end(parent, &id);
}

static void *reuse_buf;

static bool dest(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err) {
    (void)ctx;
    (void)err;
    dst[0] = reuse_buf;
    (void)meta;
    return true;
}

static int run_store(const char *base, const char *dbname, uint64_t size, uint64_t cb, int n) {
    char uri[1024];
    snprintf(uri, sizeof uri, "%s/%s", base, dbname);
    const char *names[] = {"data"};
    wh_store_config_t c;
    memset(&c, 0, sizeof c);
    wh_err_t err = {0};
    c.uri = uri;
    c.swap_cap = (uint32_t)n;
    c.chunk_bytes = cb;
    c.prefix = "bench";
    c.lease_s = 60;
    c.connect_timeout_s = 10;
    c.verify_reads = true;
    if (!wh_schema_init(&c.schema, 1, names, &err)) goto fail;
    wh_store_clean(&c, NULL);
    wh_store_t *st = wh_store_open(&c, &err);
    if (!st) goto fail;
    unsigned char *src = malloc(size);
    reuse_buf = malloc(size);
    if (!src || !reuse_buf) die("out of memory", NULL);
    for (uint64_t i = 0; i < size; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
    memset(reuse_buf, 0, size);
    wh_array_t a;
    memset(&a, 0, sizeof a);
    a.dtype = WH_DT_U8;
    a.ndim = 1;
    a.shape[0] = (int64_t)size;
    a.strides[0] = 1;
    a.data = src;
    double t0 = now();
    for (int s = 0; s < n; s++) {
        wh_put_status_t ps;
        if (!wh_store_put(st, &a, 1, 0, &ps, NULL, &err)) goto fail;
        if (ps != WH_PUT_ACCEPTED) die("put not accepted", NULL);
    }
    double write_s = now() - t0;
    bool leader = false, sealed = false;
    wh_seal_info_t info;
    if (!wh_store_lead(st, &leader, &err) || !wh_store_seal(st, &sealed, &info, &err)) goto fail;
    if (!sealed) die("seal did not happen", NULL);
    t0 = now();
    for (int s = 0; s < n; s++)
        if (!wh_store_read(st, info.generation, (uint32_t)s, dest, NULL, NULL, &err)) goto fail;
    double read_s = now() - t0;
    if (memcmp(src, reuse_buf, size) != 0) die("read back other bytes", NULL);
    printf("{\"write_s\": %.6f, \"read_s\": %.6f, \"bytes\": %llu}\n", write_s, read_s,
           (unsigned long long)size * (unsigned long long)n);
    wh_store_destroy(st);
    wh_store_clean(&c, NULL);
    free(src);
    free(reuse_buf);
    return 0;
fail:
    fprintf(stderr, "bench_mongo store: %s\n", err.message);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 7 ||
        (strcmp(argv[1], "raw") && strcmp(argv[1], "raw-index") && strcmp(argv[1], "store"))) {
        fprintf(stderr, "usage: %s raw|raw-index|store URI DB SAMPLE_BYTES CHUNK_BYTES N_SAMPLES\n",
                argv[0]);
        return 2;
    }
    const char *uri = argv[2], *dbname = argv[3];
    uint64_t size = strtoull(argv[4], NULL, 10), cb = strtoull(argv[5], NULL, 10);
    int n = atoi(argv[6]);
    if (!size || !cb || n < 1) die("bad arguments", NULL);
    if (!strcmp(argv[1], "store")) return run_store(uri, dbname, size, cb, n);
    bool index = !strcmp(argv[1], "raw-index");
    uint64_t nchunks = (size + cb - 1) / cb;
    mongoc_init();
    bson_error_t e;
    mongoc_client_t *client = mongoc_client_new(uri);
    if (!client) die("bad URI", NULL);
    mongoc_client_set_error_api(client, 2);
    mongoc_collection_t *col = mongoc_client_get_collection(client, dbname, "raw.chunks");
    mongoc_collection_t *icol = mongoc_client_get_collection(client, dbname, "raw.index");
    mongoc_collection_drop(col, NULL);
    mongoc_collection_drop(icol, NULL);
    unsigned char *src = malloc(size), *dst = malloc(size);
    if (!src || !dst) die("out of memory", NULL);
    for (uint64_t i = 0; i < size; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
    memset(dst, 0, size); /* fault the pages in before timing */

    uint64_t per = 32000000 / cb;
    if (per < 1) per = 1;
    bson_t **docs = calloc(per, sizeof *docs);
    bson_t *ordered = BCON_NEW("ordered", BCON_BOOL(true));
    double t0 = now();
    for (int s = 0; s < n; s++) {
        for (uint64_t c = 0; c < nchunks;) {
            size_t k = 0;
            for (; k < per && c < nchunks; k++, c++) {
                uint64_t off = c * cb, len = size - off < cb ? size - off : cb;
                bson_t *d = bson_sized_new((size_t)len + 64);
                append_id(d, "_id", s, (int64_t)c);
                BSON_APPEND_BINARY(d, "d", BSON_SUBTYPE_BINARY, src + off, (uint32_t)len);
                docs[k] = d;
            }
            if (!mongoc_collection_insert_many(col, (const bson_t **)docs, k, ordered, NULL, &e))
                die("insert_many", &e);
            for (size_t j = 0; j < k; j++) bson_destroy(docs[j]);
        }
        if (index) {
            bson_t *d = BCON_NEW("_id", BCON_INT32(s), "s", BCON_INT64(s), "k",
                                 BCON_INT64((int64_t)nchunks));
            if (!mongoc_collection_insert_one(icol, d, NULL, NULL, &e)) die("insert index", &e);
            bson_destroy(d);
        }
    }
    double write_s = now() - t0;

    t0 = now();
    for (int s = 0; s < n; s++) {
        if (index) {
            bson_t *f = BCON_NEW("_id", BCON_INT32(s));
            bson_t *o = BCON_NEW("limit", BCON_INT64(1), "singleBatch", BCON_BOOL(true));
            mongoc_cursor_t *cur = mongoc_collection_find_with_opts(icol, f, o, NULL);
            const bson_t *doc;
            if (!mongoc_cursor_next(cur, &doc)) die("index document missing", NULL);
            mongoc_cursor_destroy(cur);
            bson_destroy(f);
            bson_destroy(o);
        }
        bson_t q = BSON_INITIALIZER, id, in;
        BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &id);
        BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
        for (uint64_t c = 0; c < nchunks; c++) {
            char key[24];
            const char *kk;
            bson_uint32_to_string((uint32_t)c, &kk, key, sizeof key);
            append_id(&in, kk, s, (int64_t)c);
        }
        bson_append_array_end(&id, &in);
        bson_append_document_end(&q, &id);
        bson_t *opts = BCON_NEW("batchSize", BCON_INT32((int32_t)(per < nchunks ? per : nchunks)));
        mongoc_cursor_t *cur = mongoc_collection_find_with_opts(col, &q, opts, NULL);
        const bson_t *doc;
        uint64_t got = 0;
        while (mongoc_cursor_next(cur, &doc)) {
            bson_iter_t it;
            int64_t c = -1;
            const uint8_t *bytes = NULL;
            uint32_t blen = 0;
            if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "_id.c", &it))
                c = bson_iter_as_int64(&it);
            if (bson_iter_init_find(&it, doc, "d")) bson_iter_binary(&it, NULL, &blen, &bytes);
            if (c < 0 || (uint64_t)c >= nchunks || !bytes || (uint64_t)c * cb + blen > size)
                die("bad chunk", NULL);
            memcpy(dst + (uint64_t)c * cb, bytes, blen);
            got += blen;
        }
        if (mongoc_cursor_error(cur, &e)) die("find", &e);
        if (got != size) die("short read", NULL);
        mongoc_cursor_destroy(cur);
        bson_destroy(opts);
        bson_destroy(&q);
    }
    double read_s = now() - t0;
    if (memcmp(src, dst, size) != 0) die("read back other bytes", NULL);
    mongoc_collection_drop(col, NULL);
    mongoc_collection_drop(icol, NULL);
    printf("{\"write_s\": %.6f, \"read_s\": %.6f, \"bytes\": %llu}\n", write_s, read_s,
           (unsigned long long)size * (unsigned long long)n);
    free(docs);
    bson_destroy(ordered);
    free(src);
    free(dst);
    mongoc_collection_destroy(col);
    mongoc_collection_destroy(icol);
    mongoc_client_destroy(client);
    mongoc_cleanup();
    return 0;
}
