/* MongoDB backend on libmongoc/libbson.
 *
 * Collections (all prefixed with cfg->prefix, "<p>" below):
 *   <p>.state        {_id:"state"}  read_gen, write_gen, retiring, seals,
 *                                   generated, discarded, history[<=16],
 *                                   schema{version,hash,names}, swap_cap
 *                    {_id:"lease"}  owner token, expires (unix ms), pid, host
 *   <p>.gen.<n>      chunks {_id:{s:<sample id>, c:<index>}, d:<binary>}
 *                    and the position counter {_id:"ctr", n}
 *   <p>.gen.<n>.m    manifests {_id:<pos>, s, k, z, b, h}: sample id, chunk
 *                    count, data bytes, chunk size, encoded header bytes
 *
 * Put: a sample's data bytes go into chunk documents under a fresh random
 * sample id; then a position is claimed by inserting its manifest with
 * _id = pos, which the unique _id index lets exactly one sample win. The
 * counter proposes pos; a generator that died between counter and manifest
 * leaves a hole, which the next surplus put fills (it lists the manifests and
 * inserts into a missing position), so a generation always completes with
 * exactly positions 0..swap_cap-1, each pointing at complete chunks.
 *
 * Seal: when the write generation W holds swap_cap manifests, one update of
 * the state document conditional on write_gen == W makes W the read
 * generation and opens W+1 (the atomic swap). Then every generation
 * collection older than W except the retiring one (the previous read
 * generation) is dropped.
 *
 * Read: manifest first (validated with wh_sample_decode_meta), then the
 * chunks by _id with a cursor whose batchSize keeps replies under the
 * server's message limit; each chunk is checked against the manifest and
 * its bytes are copied straight into the caller's field buffers. Missing
 * data in a generation that is no longer live reads as WH_E_GONE; in a live
 * one as WH_E_CORRUPT.
 *
 * Generation ids start from the wall clock in microseconds whenever the
 * state document is created, so they keep increasing across a wiped
 * database. Nothing here relies on sessions, transactions, pipeline updates,
 * `hello`, or listCollections filters, which the in-memory test server
 * lacks; the same code is right for MongoDB 6/7. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "wh_fault.h"
#include "wh_store.h"

#define WH__HIST 16
#define WH__MAX_CHUNK (16u * 1024 * 1024 - 16 * 1024) /* BSON document limit, less room for keys */
/* Chunks per sample: a reader's filter names each, and must stay far below
 * the 16 MiB BSON limit (about 30 bytes per chunk). */
#define WH__MAX_CHUNKS (1u << 18)
#define WH__DEFAULT_CHUNK (4u * 1024 * 1024)
#define WH__BATCH_BYTES (32u * 1000 * 1000) /* per reply; libmongoc refuses 48 MB */
#define WH__INSERT_BYTES (32u * 1000 * 1000) /* chunk bytes per insert_many call */
#define WH__REPAIR_TRIES 32
#define WH__NAME_MAX 256

typedef struct {
    uint64_t read_gen, write_gen, retiring;
    uint64_t seals, generated, discarded;
    int nhist;
    struct {
        uint64_t generation, time_ns, generated, discarded, seal_ns;
    } hist[WH__HIST];
} wh__state_t;

typedef struct {
    wh_store_t base;
    mongoc_client_t *client;
    char db[128];
    char prefix[128];
    char where[512];  /* URI without credentials or options, for messages */
    char secret[256]; /* userinfo of the URI, scrubbed from libmongoc messages */
    uint64_t token;   /* lease owner id of this handle */
    pid_t pid;
    uint64_t chunk_bytes;
    double wait_s;       /* server selection timeout, for messages */
    uint64_t known_read; /* newest read generation this handle has seen */
    unsigned char *buf;  /* encode buffer, reused across puts */
    uint64_t buf_cap;
    unsigned char *seen; /* chunk bitmap for reads, reused */
    uint64_t seen_cap;
    char host[64];
} wh__mongo_t;

static const wh_store_ops_t wh__mongo_ops;

/* ---- process-wide setup ---- */

static pthread_once_t wh__once = PTHREAD_ONCE_INIT;

/* libmongoc warnings go to stderr; URIs in them lose their credentials. */
static void wh__log(mongoc_log_level_t level, const char *domain, const char *message,
                    void *data) {
    WH_UNUSED(data);
    if (level > MONGOC_LOG_LEVEL_WARNING) return;
    char out[1024];
    size_t k = 0;
    for (const char *p = message; *p && k + 4 < sizeof out;) {
        const char *at = strstr(p, "://");
        if (!at) {
            k += (size_t)snprintf(out + k, sizeof out - k, "%s", p);
            break;
        }
        size_t n = (size_t)(at - p) + 3;
        if (n > sizeof out - k - 1) n = sizeof out - k - 1;
        memcpy(out + k, p, n);
        k += n;
        p = at + 3;
        const char *end = p + strcspn(p, "/? \t\n");
        const char *cred = memchr(p, '@', (size_t)(end - p));
        const char *last = cred;
        while (last && (cred = memchr(last + 1, '@', (size_t)(end - last - 1)))) last = cred;
        if (last) p = last + 1;
    }
    if (k >= sizeof out) k = sizeof out - 1;
    out[k] = '\0';
    fprintf(stderr, "wirehead: mongoc %s: %s\n", domain ? domain : "", out);
}

/* ---- libbson/libmongoc memory: large blocks reused ----
 * Reply batches (up to WH__BATCH_BYTES) and their growth land in fresh
 * pages on every read with the system allocator: a page fault per 4 KiB,
 * more client CPU than the copy itself. Blocks of WH__BIG bytes or more
 * are mapped once (huge pages advised) and kept for the next reply; every
 * other allocation, and any pointer this cache did not hand out, goes to
 * the system allocator unchanged. */
#define WH__BIG (1u << 20)
#define WH__BIG_SLOTS 32                    /* big blocks tracked (live + idle) */
#define WH__BIG_KEEP ((size_t)256 << 20)    /* most bytes kept idle */

typedef struct {
    void *p;     /* NULL: free entry */
    size_t cap;  /* bytes mapped */
    size_t size; /* bytes asked for */
    bool idle;
} wh__big_t;

static pthread_mutex_t wh__big_mu = PTHREAD_MUTEX_INITIALIZER;
static wh__big_t wh__big[WH__BIG_SLOTS];

static void wh__big_atfork_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    wh__big_mu = fresh;
}

/* Tracked entry of a live block p, or -1 (lock held). */
static int wh__big_find(const void *p) {
    for (int i = 0; p && i < WH__BIG_SLOTS; i++)
        if (wh__big[i].p == p && !wh__big[i].idle) return i;
    return -1;
}

static void *wh__big_alloc(size_t size, bool *fresh) {
    size_t cap = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    void *got = NULL;
    pthread_mutex_lock(&wh__big_mu);
    int best = -1, free_i = -1;
    for (int i = 0; i < WH__BIG_SLOTS; i++) {
        if (!wh__big[i].p) {
            if (free_i < 0) free_i = i;
        } else if (wh__big[i].idle && wh__big[i].cap >= cap && wh__big[i].cap <= 2 * cap &&
                   (best < 0 || wh__big[i].cap < wh__big[best].cap)) {
            best = i;
        }
    }
    if (best >= 0) {
        wh__big[best].idle = false;
        wh__big[best].size = size;
        got = wh__big[best].p;
        *fresh = false;
    } else if (free_i >= 0) {
        void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) {
            madvise(p, cap, MADV_HUGEPAGE); /* advice only */
            wh__big[free_i] = (wh__big_t){p, cap, size, false};
            got = p;
            *fresh = true;
        }
    }
    pthread_mutex_unlock(&wh__big_mu);
    return got; /* NULL: untracked, the caller uses the system allocator */
}

/* Returns a tracked block to the idle set, unmapping idle blocks beyond
 * WH__BIG_KEEP; false if p is not ours. */
static bool wh__big_release(void *p) {
    pthread_mutex_lock(&wh__big_mu);
    int i = wh__big_find(p);
    if (i >= 0) {
        wh__big[i].idle = true;
        size_t idle = 0;
        for (int k = 0; k < WH__BIG_SLOTS; k++)
            if (wh__big[k].p && wh__big[k].idle) idle += wh__big[k].cap;
        for (int k = 0; k < WH__BIG_SLOTS && idle > WH__BIG_KEEP; k++)
            if (wh__big[k].p && wh__big[k].idle && k != i) {
                munmap(wh__big[k].p, wh__big[k].cap);
                idle -= wh__big[k].cap;
                wh__big[k].p = NULL;
            }
    }
    pthread_mutex_unlock(&wh__big_mu);
    return i >= 0;
}

static void *wh__mem_malloc(size_t n) {
    bool fresh;
    void *p = n >= WH__BIG ? wh__big_alloc(n, &fresh) : NULL;
    return p ? p : malloc(n);
}

static void *wh__mem_calloc(size_t k, size_t n) {
    size_t t;
    if (__builtin_mul_overflow(k, n, &t)) return NULL;
    bool fresh = false;
    void *p = t >= WH__BIG ? wh__big_alloc(t, &fresh) : NULL;
    if (!p) return calloc(k, n);
    if (!fresh) memset(p, 0, t); /* a fresh mapping is zero already */
    return p;
}

static void wh__mem_free(void *p) {
    if (p && !wh__big_release(p)) free(p);
}

static void *wh__mem_realloc(void *p, size_t n) {
    if (!p) return wh__mem_malloc(n);
    pthread_mutex_lock(&wh__big_mu);
    int i = wh__big_find(p);
    size_t old = i >= 0 ? wh__big[i].size : 0, cap = i >= 0 ? wh__big[i].cap : 0;
    if (i >= 0 && n <= cap) wh__big[i].size = n;
    pthread_mutex_unlock(&wh__big_mu);
    if (i >= 0 && n <= cap) return p; /* shrinking or growing within the mapping */
    if (i < 0 && n < WH__BIG) return realloc(p, n);
    if (i < 0) old = malloc_usable_size(p);
    void *q = wh__mem_malloc(n);
    if (!q) return NULL;
    memcpy(q, p, old < n ? old : n);
    wh__mem_free(p);
    return q;
}

static void *wh__mem_aligned(size_t align, size_t n) {
    return aligned_alloc(align, (n + align - 1) / align * align);
}

static void wh__init_once(void) {
    /* before mongoc_init: every libbson allocation from here on is ours */
    static const bson_mem_vtable_t vt = {wh__mem_malloc, wh__mem_calloc, wh__mem_realloc,
                                         wh__mem_free, wh__mem_aligned, {NULL, NULL, NULL}};
    bson_mem_set_vtable(&vt);
    pthread_atfork(NULL, NULL, wh__big_atfork_child);
    mongoc_init();
    mongoc_log_set_handler(wh__log, NULL);
}

/* ---- errors ---- */

/* Removes the URI's userinfo (and its password alone) from msg in place. */
static void wh__scrub(const wh__mongo_t *m, char *msg) {
    if (!m || !m->secret[0]) return;
    const char *needles[2] = {m->secret, strchr(m->secret, ':')};
    for (int i = 0; i < 2; i++) {
        const char *nd = needles[i];
        if (!nd) continue;
        if (i == 1) nd++;
        size_t n = strlen(nd);
        if (n < 3) continue;
        char *hit;
        while ((hit = strstr(msg, nd))) {
            memmove(hit + 3, hit + n, strlen(hit + n) + 1);
            memcpy(hit, "***", 3);
        }
    }
}

static bool wh__is_unavail(const bson_error_t *e) {
    if (e->domain == MONGOC_ERROR_SERVER_SELECTION || e->domain == MONGOC_ERROR_STREAM)
        return true;
    /* of the client's own errors only "no server yet" is an outage; a failed
     * login or an oversized command is the caller's to fix */
    if (e->domain == MONGOC_ERROR_CLIENT)
        return e->code == MONGOC_ERROR_CLIENT_NOT_READY ||
               e->code == MONGOC_ERROR_CLIENT_NO_ACCEPTABLE_PEER;
    switch (e->code) {
    case 6:     /* HostUnreachable */
    case 7:     /* HostNotFound */
    case 89:    /* NetworkTimeout */
    case 91:    /* ShutdownInProgress */
    case 189:   /* PrimarySteppedDown */
    case 262:   /* ExceededTimeLimit */
    case 9001:  /* SocketException */
    case 10107: /* NotWritablePrimary */
    case 11600: /* InterruptedAtShutdown */
    case 11602: /* InterruptedDueToReplStateChange */
    case 13435: /* NotPrimaryNoSecondaryOk */
    case 13436: /* NotPrimaryOrSecondary */
        return e->domain == MONGOC_ERROR_SERVER || e->domain == MONGOC_ERROR_QUERY ||
               e->domain == MONGOC_ERROR_COMMAND || e->domain == MONGOC_ERROR_WRITE_CONCERN;
    default:
        return false;
    }
}

static bool wh__is_dup(const bson_error_t *e) {
    return e->code == 11000 || e->code == 11001;
}

/* Sets err from a libmongoc error: "<what>: <libmongoc message> (<where>)". */
static bool wh__merr(const wh__mongo_t *m, wh_err_t *err, const bson_error_t *e,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool wh__merr(const wh__mongo_t *m, wh_err_t *err, const bson_error_t *e,
                     const char *fmt, ...) {
    if (!err) return false;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char msg[sizeof e->message];
    memcpy(msg, e->message, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    wh__scrub(m, msg);
    if (e->domain == MONGOC_ERROR_SERVER_SELECTION)
        return wh_err_set(err, WH_E_UNAVAIL,
                          "%s: MongoDB at %s unreachable (waited %.1f s, CONNECT_TIMEOUT): %s",
                          what, m ? m->where : "?", m ? m->wait_s : 0.0, msg);
    if (wh__is_unavail(e))
        return wh_err_set(err, WH_E_UNAVAIL, "%s: MongoDB at %s unavailable: %s", what,
                          m ? m->where : "?", msg);
    bool server = e->domain == MONGOC_ERROR_SERVER || e->domain == MONGOC_ERROR_QUERY ||
                  e->domain == MONGOC_ERROR_COMMAND;
    if ((e->domain == MONGOC_ERROR_CLIENT && e->code == MONGOC_ERROR_CLIENT_AUTHENTICATE) ||
        (server && (e->code == 18 /* AuthenticationFailed */ || e->code == 13 /* Unauthorized */)))
        return wh_err_set(err, WH_E_INTERNAL,
                          "%s: MongoDB at %s refused this client's credentials or rights "
                          "(check the user, password and authSource in STORE): %s",
                          what, m ? m->where : "?", msg);
    return wh_err_set(err, WH_E_INTERNAL, "%s: %s (MongoDB at %s, error %u.%u)", what, msg,
                      m ? m->where : "?", e->domain, e->code);
}

/* Samples at least this large have their chunks counted before a reader
 * allocates for them. */
#define WH__CONFIRM_BYTES (64ull << 20)

/* ---- small helpers ---- */

static uint64_t wh__rand64(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != sizeof v)
        v = wh_now_real_ns() * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 17);
    return v;
}

static void wh__coll_name(char *out, size_t cap, const wh__mongo_t *m, uint64_t gen,
                          bool manifests) {
    snprintf(out, cap, "%s.gen.%llu%s", m->prefix, (unsigned long long)gen,
             manifests ? ".m" : "");
}

static mongoc_collection_t *wh__coll(wh__mongo_t *m, const char *name) {
    return mongoc_client_get_collection(m->client, m->db, name);
}

static mongoc_collection_t *wh__gen_coll(wh__mongo_t *m, uint64_t gen, bool manifests) {
    char name[WH__NAME_MAX];
    wh__coll_name(name, sizeof name, m, gen, manifests);
    return wh__coll(m, name);
}

static mongoc_collection_t *wh__state_coll(wh__mongo_t *m) {
    char name[WH__NAME_MAX];
    snprintf(name, sizeof name, "%s.state", m->prefix);
    return wh__coll(m, name);
}

/* Integer value of key in doc (int32, int64 or an integral double). */
static bool wh__get_int(const bson_t *doc, const char *key, int64_t *out) {
    bson_iter_t it;
    if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, key, &it)) return false;
    switch (bson_iter_type(&it)) {
    case BSON_TYPE_INT32:
        *out = bson_iter_int32(&it);
        return true;
    case BSON_TYPE_INT64:
        *out = bson_iter_int64(&it);
        return true;
    case BSON_TYPE_DOUBLE: {
        double d = bson_iter_double(&it);
        if (d != d || d < -9.2e18 || d > 9.2e18 || (double)(int64_t)d != d) return false;
        *out = (int64_t)d;
        return true;
    }
    default:
        return false;
    }
}

static uint64_t wh__get_u64_or0(const bson_t *doc, const char *key) {
    int64_t v = 0;
    return (wh__get_int(doc, key, &v) && v > 0) ? (uint64_t)v : 0;
}

/* First document matching filter into *out (bson_init'ed by the caller,
 * caller destroys); *found false when none. */
static bool wh__find_one(wh__mongo_t *m, mongoc_collection_t *c, const bson_t *filter,
                         bson_t *out, bool *found, const char *what, wh_err_t *err) {
    bson_t opts = BSON_INITIALIZER;
    BSON_APPEND_INT64(&opts, "limit", 1);
    BSON_APPEND_INT32(&opts, "batchSize", 1);
    BSON_APPEND_BOOL(&opts, "singleBatch", true);
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, filter, &opts, NULL);
    bson_destroy(&opts);
    const bson_t *doc;
    bson_error_t e;
    *found = false;
    if (mongoc_cursor_next(cur, &doc)) {
        bson_destroy(out);
        bson_copy_to(doc, out);
        *found = true;
    }
    bool ok = !mongoc_cursor_error(cur, &e);
    mongoc_cursor_destroy(cur);
    if (!ok) return wh__merr(m, err, &e, "%s", what);
    return true;
}

/* ---- connection ---- */

/* "mongodb://host1,host2/db" from a parsed URI: no credentials, no options. */
static void wh__describe(const mongoc_uri_t *uri, const char *db, char *out, size_t cap) {
    size_t k = 0;
    const char *srv = mongoc_uri_get_srv_hostname(uri);
    if (srv) {
        k = (size_t)snprintf(out, cap, "mongodb+srv://%s", srv);
    } else {
        k = (size_t)snprintf(out, cap, "mongodb://");
        int i = 0;
        for (const mongoc_host_list_t *h = mongoc_uri_get_hosts(uri); h && k < cap; h = h->next)
            k += (size_t)snprintf(out + k, cap - k, "%s%s", i++ ? "," : "", h->host_and_port);
    }
    if (k < cap) snprintf(out + k, cap - k, "/%s", db);
}

/* Userinfo of the raw URI ("user:pass"), if any. */
static void wh__userinfo(const char *raw, char *out, size_t cap) {
    out[0] = '\0';
    const char *p = strstr(raw, "://");
    if (!p) return;
    p += 3;
    const char *q = strchr(p, '?');
    size_t span = q ? (size_t)(q - p) : strlen(p);
    const char *at = NULL;
    for (size_t i = 0; i < span; i++)
        if (p[i] == '@') at = p + i;
    if (!at) return;
    size_t n = (size_t)(at - p);
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

static bool wh__connect(wh__mongo_t *m, const wh_store_config_t *cfg, wh_err_t *err) {
    pthread_once(&wh__once, wh__init_once);
    wh__userinfo(cfg->uri, m->secret, sizeof m->secret);
    snprintf(m->where, sizeof m->where, "mongodb://?");
    bson_error_t e;
    mongoc_uri_t *uri = mongoc_uri_new_with_error(cfg->uri, &e);
    if (!uri) {
        char msg[sizeof e.message];
        memcpy(msg, e.message, sizeof msg);
        wh__scrub(m, msg);
        return wh_err_set(err, WH_E_INVALID, "invalid MongoDB URI: %s", msg);
    }
    const char *db = mongoc_uri_get_database(uri);
    if (!db || !*db) db = (cfg->dbname && *cfg->dbname) ? cfg->dbname : "wirehead";
    if (strlen(db) >= sizeof m->db) {
        mongoc_uri_destroy(uri);
        return wh_err_set(err, WH_E_INVALID, "database name too long");
    }
    snprintf(m->db, sizeof m->db, "%s", db);
    wh__describe(uri, m->db, m->where, sizeof m->where);

    /* Options the URI leaves unset: a bounded wait for the server, and retry
     * inside that wait rather than failing at the first refused connection. */
    double t = cfg->connect_timeout_s > 0 ? cfg->connect_timeout_s : 10.0;
    int32_t ms = t * 1000.0 > 2e9 ? 2000000000 : (int32_t)(t * 1000.0);
    if (ms < 1) ms = 1;
    if (!mongoc_uri_has_option(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS))
        mongoc_uri_set_option_as_int32(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, ms);
    m->wait_s = mongoc_uri_get_option_as_int32(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, ms) / 1000.0;
    if (!mongoc_uri_has_option(uri, MONGOC_URI_CONNECTTIMEOUTMS))
        mongoc_uri_set_option_as_int32(uri, MONGOC_URI_CONNECTTIMEOUTMS, ms < 10000 ? ms : 10000);
    if (!mongoc_uri_has_option(uri, MONGOC_URI_SERVERSELECTIONTRYONCE))
        mongoc_uri_set_option_as_bool(uri, MONGOC_URI_SERVERSELECTIONTRYONCE, false);
    if (!mongoc_uri_has_option(uri, MONGOC_URI_SOCKETTIMEOUTMS))
        mongoc_uri_set_option_as_int32(uri, MONGOC_URI_SOCKETTIMEOUTMS, 120000);
    if (!mongoc_uri_get_option_as_utf8(uri, MONGOC_URI_APPNAME, NULL))
        mongoc_uri_set_appname(uri, "wirehead_torch");

    m->client = mongoc_client_new_from_uri_with_error(uri, &e);
    mongoc_uri_destroy(uri);
    if (!m->client) {
        char msg[sizeof e.message];
        memcpy(msg, e.message, sizeof msg);
        wh__scrub(m, msg);
        return wh_err_set(err, WH_E_INVALID, "MongoDB client for %s: %s", m->where, msg);
    }
    mongoc_client_set_error_api(m->client, MONGOC_ERROR_API_VERSION_2);
    /* A reader must see a sample's chunks once it sees its manifest: read
     * from the primary whatever readPreference the URI asks for. */
    mongoc_read_prefs_t *rp = mongoc_read_prefs_new(MONGOC_READ_PRIMARY);
    mongoc_client_set_read_prefs(m->client, rp);
    mongoc_read_prefs_destroy(rp);
    return true;
}

/* ---- state document ---- */

static void wh__append_schema(bson_t *doc, const wh_store_config_t *cfg) {
    bson_t sch, names;
    BSON_APPEND_DOCUMENT_BEGIN(doc, "schema", &sch);
    BSON_APPEND_INT32(&sch, "version", WH_FORMAT_VERSION);
    BSON_APPEND_INT64(&sch, "hash", (int64_t)cfg->schema.hash);
    BSON_APPEND_ARRAY_BEGIN(&sch, "names", &names);
    for (int i = 0; i < cfg->schema.nfields; i++) {
        char key[16];
        const char *k;
        bson_uint32_to_string((uint32_t)i, &k, key, sizeof key);
        BSON_APPEND_UTF8(&names, k, cfg->schema.names[i]);
    }
    bson_append_array_end(&sch, &names);
    bson_append_document_end(doc, &sch);
    BSON_APPEND_INT64(doc, "swap_cap", cfg->swap_cap);
}

static bool wh__check_schema(const wh__mongo_t *m, const bson_t *doc, wh_err_t *err) {
    const wh_store_config_t *cfg = &m->base.cfg;
    int64_t ver = 0, hash = 0, cap = 0;
    if (!wh__get_int(doc, "schema.version", &ver) || !wh__get_int(doc, "schema.hash", &hash) ||
        !wh__get_int(doc, "swap_cap", &cap))
        return wh_err_set(err, WH_E_CORRUPT, "store '%s' at %s: state document lacks its schema",
                          m->prefix, m->where);
    if (ver != WH_FORMAT_VERSION)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store '%s' at %s has format version %lld, this build uses %d; "
                          "remove it with `wirehead-torch clean`",
                          m->prefix, m->where, (long long)ver, WH_FORMAT_VERSION);
    if ((uint64_t)hash != cfg->schema.hash) {
        char have[WH_MAX_FIELDS * (WH_MAX_NAME + 2)] = "";
        bson_iter_t it, arr;
        if (bson_iter_init(&it, doc) && bson_iter_find_descendant(&it, "schema.names", &it) &&
            BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr)) {
            size_t k = 0;
            while (bson_iter_next(&arr) && k < sizeof have - 1) {
                if (!BSON_ITER_HOLDS_UTF8(&arr)) continue;
                k += (size_t)snprintf(have + k, sizeof have - k, "%s%s", k ? ", " : "",
                                      bson_iter_utf8(&arr, NULL));
            }
        }
        return wh_err_set(err, WH_E_SCHEMA,
                          "store '%s' at %s was created with SAMPLE [%s], config says another; "
                          "use another WRITE_COLLECTION prefix or `wirehead-torch clean`",
                          m->prefix, m->where, have);
    }
    if ((uint64_t)cap != cfg->swap_cap)
        return wh_err_set(err, WH_E_SCHEMA,
                          "store '%s' at %s was created with SWAP_CAP=%lld, config says %u; "
                          "use another WRITE_COLLECTION prefix or `wirehead-torch clean`",
                          m->prefix, m->where, (long long)cap, cfg->swap_cap);
    return true;
}

static void wh__parse_state(const bson_t *doc, wh__state_t *s) {
    memset(s, 0, sizeof *s);
    s->read_gen = wh__get_u64_or0(doc, "read_gen");
    s->write_gen = wh__get_u64_or0(doc, "write_gen");
    s->retiring = wh__get_u64_or0(doc, "retiring");
    s->seals = wh__get_u64_or0(doc, "seals");
    s->generated = wh__get_u64_or0(doc, "generated");
    s->discarded = wh__get_u64_or0(doc, "discarded");
    bson_iter_t it, arr;
    if (bson_iter_init_find(&it, doc, "history") && BSON_ITER_HOLDS_ARRAY(&it) &&
        bson_iter_recurse(&it, &arr)) {
        while (bson_iter_next(&arr) && s->nhist < WH__HIST) {
            if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) continue;
            uint32_t len;
            const uint8_t *data;
            bson_iter_document(&arr, &len, &data);
            bson_t h;
            if (!bson_init_static(&h, data, len)) continue;
            int k = s->nhist++;
            s->hist[k].generation = wh__get_u64_or0(&h, "generation");
            s->hist[k].time_ns = wh__get_u64_or0(&h, "time_ns");
            s->hist[k].generated = wh__get_u64_or0(&h, "generated");
            s->hist[k].discarded = wh__get_u64_or0(&h, "discarded");
            s->hist[k].seal_ns = wh__get_u64_or0(&h, "seal_ns");
        }
    }
}

/* Reads the state document, creating it when missing (first use, or a wiped
 * database) if create is set; *exists false when missing and not created. */
static bool wh__state_get(wh__mongo_t *m, bool create, wh__state_t *s, bool *exists,
                          wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t filter = BSON_INITIALIZER, doc = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&filter, "_id", "state");
    bool ok = true, found = false;
    for (int attempt = 0; ok && attempt < 3; attempt++) {
        ok = wh__find_one(m, c, &filter, &doc, &found, "read store state", err);
        if (!ok || found || !create) break;
        /* Generation ids start at the wall clock in nanoseconds: larger
         * than any id the store had before it was wiped. */
        uint64_t g0 = wh_now_real_ns();
        bson_t init = BSON_INITIALIZER, hist;
        BSON_APPEND_UTF8(&init, "_id", "state");
        BSON_APPEND_INT64(&init, "read_gen", 0);
        BSON_APPEND_INT64(&init, "write_gen", (int64_t)g0);
        BSON_APPEND_INT64(&init, "retiring", 0);
        BSON_APPEND_INT64(&init, "seals", 0);
        BSON_APPEND_INT64(&init, "generated", 0);
        BSON_APPEND_INT64(&init, "discarded", 0);
        BSON_APPEND_ARRAY_BEGIN(&init, "history", &hist);
        bson_append_array_end(&init, &hist);
        wh__append_schema(&init, &m->base.cfg);
        BSON_APPEND_INT64(&init, "created_ns", (int64_t)wh_now_real_ns());
        bson_error_t e;
        if (!mongoc_collection_insert_one(c, &init, NULL, NULL, &e) && !wh__is_dup(&e))
            ok = wh__merr(m, err, &e, "create store state");
        bson_destroy(&init);
        /* inserted, or someone else created it first: read it back */
    }
    if (ok && create && !found)
        ok = wh_err_set(err, WH_E_INTERNAL, "store state document keeps disappearing at %s",
                        m->where);
    if (ok && found) ok = wh__check_schema(m, &doc, err);
    if (ok) {
        if (found) wh__parse_state(&doc, s);
        else memset(s, 0, sizeof *s);
        if (found && (s->write_gen == 0 || s->read_gen >= s->write_gen))
            ok = wh_err_set(err, WH_E_CORRUPT, "store '%s' at %s: state document is inconsistent "
                            "(read %llu, write %llu)", m->prefix, m->where,
                            (unsigned long long)s->read_gen, (unsigned long long)s->write_gen);
        if (ok && found && s->read_gen > m->known_read) m->known_read = s->read_gen;
    }
    if (exists) *exists = found;
    bson_destroy(&doc);
    bson_destroy(&filter);
    mongoc_collection_destroy(c);
    return ok;
}

static bool wh__inc_discarded(wh__mongo_t *m, wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"));
    bson_t *upd = BCON_NEW("$inc", "{", "discarded", BCON_INT64(1), "}");
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, sel, upd, NULL, NULL, &e);
    if (!ok) wh__merr(m, err, &e, "count a discarded sample");
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(c);
    return ok;
}

/* ---- generation fill ---- */

/* Number of manifests in generation gen (positions 0..swap_cap-1). */
static bool wh__count_manifests(wh__mongo_t *m, uint64_t gen, uint64_t *n, wh_err_t *err) {
    mongoc_collection_t *c = wh__gen_coll(m, gen, true);
    bson_t *filter = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt",
                              BCON_INT64((int64_t)m->base.cfg.swap_cap), "}");
    bson_error_t e;
    int64_t k = mongoc_collection_count_documents(c, filter, NULL, NULL, NULL, &e);
    bson_destroy(filter);
    mongoc_collection_destroy(c);
    if (k < 0) return wh__merr(m, err, &e, "count samples of generation %llu",
                               (unsigned long long)gen);
    *n = (uint64_t)k;
    return true;
}

/* Value of the position counter of gen (0 when it does not exist yet). */
static bool wh__counter(wh__mongo_t *m, uint64_t gen, uint64_t *n, wh_err_t *err) {
    mongoc_collection_t *c = wh__gen_coll(m, gen, false);
    bson_t *filter = BCON_NEW("_id", BCON_UTF8("ctr"));
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, c, filter, &doc, &found, "read position counter", err);
    *n = found ? wh__get_u64_or0(&doc, "n") : 0;
    bson_destroy(&doc);
    bson_destroy(filter);
    mongoc_collection_destroy(c);
    return ok;
}

/* Full when every position has its manifest. The counter is read first so
 * that the common not-full case costs one lookup by _id. */
static bool wh__gen_full(wh__mongo_t *m, uint64_t gen, bool *full, uint64_t *fill,
                         wh_err_t *err) {
    uint64_t ctr = 0, n = 0;
    *full = false;
    if (!wh__counter(m, gen, &ctr, err)) return false;
    if (ctr < m->base.cfg.swap_cap && !fill) return true;
    if (!wh__count_manifests(m, gen, &n, err)) return false;
    *full = n >= m->base.cfg.swap_cap;
    if (fill) *fill = n;
    return true;
}

/* ---- put ---- */

/* {_id: {$in: [{s: sid, c: 0}, ..., {s: sid, c: nchunks-1}]}}: one sample's
 * chunks, found through the _id index. */
static void wh__chunk_filter(bson_t *q, int64_t sid, uint64_t nchunks) {
    bson_t id, in;
    BSON_APPEND_DOCUMENT_BEGIN(q, "_id", &id);
    BSON_APPEND_ARRAY_BEGIN(&id, "$in", &in);
    for (uint64_t i = 0; i < nchunks; i++) {
        char key[24];
        const char *k;
        bson_t one;
        bson_uint32_to_string((uint32_t)i, &k, key, sizeof key);
        BSON_APPEND_DOCUMENT_BEGIN(&in, k, &one);
        BSON_APPEND_INT64(&one, "s", sid);
        BSON_APPEND_INT64(&one, "c", (int64_t)i);
        bson_append_document_end(&in, &one);
    }
    bson_append_array_end(&id, &in);
    bson_append_document_end(q, &id);
}

static bool wh__delete_chunks(wh__mongo_t *m, mongoc_collection_t *c, int64_t sid,
                              uint64_t nchunks, wh_err_t *err) {
    if (!nchunks) return true;
    bson_t sel = BSON_INITIALIZER;
    wh__chunk_filter(&sel, sid, nchunks);
    bson_error_t e;
    bool ok = mongoc_collection_delete_many(c, &sel, NULL, NULL, &e);
    bson_destroy(&sel);
    if (!ok) return wh__merr(m, err, &e, "delete chunks of a discarded sample");
    return true;
}

/* Inserts chunks [from, to) of the sample's data (buf + header_size, len
 * bytes) as {_id:{s,c}, d}, in insert_many calls of bounded size. */
static bool wh__insert_chunks(wh__mongo_t *m, mongoc_collection_t *c, int64_t sid,
                              const unsigned char *data, uint64_t len, uint64_t cb,
                              uint64_t from, uint64_t to, bool *dup, wh_err_t *err) {
    uint64_t per = WH__INSERT_BYTES / cb;
    if (per < 1) per = 1;
    if (per > 1000) per = 1000;
    bson_t **docs = calloc(per, sizeof *docs);
    if (!docs) return wh_err_set(err, WH_E_SYS, "out of memory");
    bool ok = true;
    *dup = false;
    for (uint64_t i = from; ok && i < to;) {
        size_t n = 0;
        for (; n < per && i < to; n++, i++) {
            uint64_t off = i * cb;
            uint64_t clen = len - off < cb ? len - off : cb;
            bson_t *d = bson_sized_new((size_t)clen + 64);
            bson_t id;
            BSON_APPEND_DOCUMENT_BEGIN(d, "_id", &id);
            BSON_APPEND_INT64(&id, "s", sid);
            BSON_APPEND_INT64(&id, "c", (int64_t)i);
            bson_append_document_end(d, &id);
            BSON_APPEND_BINARY(d, "d", BSON_SUBTYPE_BINARY, data + off, (uint32_t)clen);
            docs[n] = d;
        }
        bson_error_t e;
        bson_t *opts = BCON_NEW("ordered", BCON_BOOL(true));
        if (!mongoc_collection_insert_many(c, (const bson_t **)docs, n, opts, NULL, &e)) {
            *dup = wh__is_dup(&e);
            ok = wh__merr(m, err, &e, "write %zu chunks", n);
        }
        bson_destroy(opts);
        for (size_t k = 0; k < n; k++) bson_destroy(docs[k]);
    }
    free(docs);
    return ok;
}

static bool wh__insert_manifest(wh__mongo_t *m, mongoc_collection_t *mc, uint32_t pos,
                                int64_t sid, uint64_t nchunks, uint64_t data_len, uint64_t cb,
                                const unsigned char *hdr, uint64_t hlen, bool *won,
                                wh_err_t *err) {
    bson_t d = BSON_INITIALIZER;
    BSON_APPEND_INT32(&d, "_id", (int32_t)pos);
    BSON_APPEND_INT64(&d, "s", sid);
    BSON_APPEND_INT64(&d, "k", (int64_t)nchunks);
    BSON_APPEND_INT64(&d, "z", (int64_t)data_len);
    BSON_APPEND_INT64(&d, "b", (int64_t)cb);
    BSON_APPEND_BINARY(&d, "h", BSON_SUBTYPE_BINARY, hdr, (uint32_t)hlen);
    bson_error_t e;
    bool ok = true;
    *won = mongoc_collection_insert_one(mc, &d, NULL, NULL, &e);
    if (!*won && !wh__is_dup(&e)) ok = wh__merr(m, err, &e, "commit sample at position %u", pos);
    bson_destroy(&d);
    return ok;
}

/* Next candidate position from the generation's counter (may be >= swap_cap). */
static bool wh__claim(wh__mongo_t *m, mongoc_collection_t *c, uint64_t *pos, wh_err_t *err) {
    bson_t *q = BCON_NEW("_id", BCON_UTF8("ctr"));
    bson_t *upd = BCON_NEW("$inc", "{", "n", BCON_INT64(1), "}");
    mongoc_find_and_modify_opts_t *o = mongoc_find_and_modify_opts_new();
    mongoc_find_and_modify_opts_set_update(o, upd);
    mongoc_find_and_modify_opts_set_flags(
        o, MONGOC_FIND_AND_MODIFY_UPSERT | MONGOC_FIND_AND_MODIFY_RETURN_NEW);
    bool ok = false;
    for (int attempt = 0; attempt < 3 && !ok; attempt++) {
        bson_t reply;
        bson_error_t e;
        if (mongoc_collection_find_and_modify_with_opts(c, q, o, &reply, &e)) {
            int64_t n = 0;
            if (wh__get_int(&reply, "value.n", &n) && n >= 1) {
                *pos = (uint64_t)(n - 1);
                ok = true;
            } else {
                bson_destroy(&reply);
                break;
            }
        } else if (!wh__is_dup(&e)) { /* a racing upsert inserted it: retry */
            bson_destroy(&reply);
            mongoc_find_and_modify_opts_destroy(o);
            bson_destroy(q);
            bson_destroy(upd);
            return wh__merr(m, err, &e, "claim a position");
        }
        bson_destroy(&reply);
    }
    mongoc_find_and_modify_opts_destroy(o);
    bson_destroy(q);
    bson_destroy(upd);
    if (!ok) return wh_err_set(err, WH_E_INTERNAL, "claim a position: no counter value");
    return true;
}

/* Positions 0..swap_cap-1 without a manifest: picks one at random into
 * *hole; *nholes 0 when the generation is full. */
static bool wh__find_hole(wh__mongo_t *m, mongoc_collection_t *mc, uint32_t *hole,
                          uint64_t *nholes, wh_err_t *err) {
    uint32_t cap = m->base.cfg.swap_cap;
    unsigned char *have = calloc(cap, 1);
    if (!have) return wh_err_set(err, WH_E_SYS, "out of memory");
    bson_t *filter = BCON_NEW("_id", "{", "$gte", BCON_INT32(0), "$lt", BCON_INT64(cap), "}");
    bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}", "batchSize",
                            BCON_INT32(100000));
    mongoc_cursor_t *cur = mongoc_collection_find_with_opts(mc, filter, opts, NULL);
    const bson_t *doc;
    while (mongoc_cursor_next(cur, &doc)) {
        int64_t p;
        if (wh__get_int(doc, "_id", &p) && p >= 0 && p < cap) have[p] = 1;
    }
    bson_error_t e;
    bool ok = true;
    if (mongoc_cursor_error(cur, &e)) ok = wh__merr(m, err, &e, "list committed positions");
    mongoc_cursor_destroy(cur);
    bson_destroy(filter);
    bson_destroy(opts);
    if (ok) {
        uint64_t n = 0;
        for (uint32_t i = 0; i < cap; i++) n += !have[i];
        *nholes = n;
        if (n) {
            uint64_t pick = wh__rand64() % n;
            for (uint32_t i = 0; i < cap; i++) {
                if (!have[i] && pick-- == 0) {
                    *hole = i;
                    break;
                }
            }
        }
    }
    free(have);
    return ok;
}

static bool wh__grow(unsigned char **buf, uint64_t *cap, uint64_t need, wh_err_t *err) {
    if (*cap >= need) return true;
    unsigned char *p = realloc(*buf, need);
    if (!p) return wh_err_set(err, WH_E_SYS, "out of memory for %llu bytes",
                              (unsigned long long)need);
    *buf = p;
    *cap = need;
    return true;
}

static bool wh__mongo_put(wh_store_t *st, const wh_array_t *arr, int n, unsigned wait_ms,
                          wh_put_status_t *status, uint64_t *genp, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    WH_UNUSED(wait_ms); /* never waits: storage is the server's */
    wh_sample_meta_t meta;
    if (!wh_sample_plan(&st->cfg.schema, arr, n, &meta, err)) return false;
    if (!wh__grow(&m->buf, &m->buf_cap, meta.total_size, err)) return false;
    if (!wh_sample_encode(m->buf, m->buf_cap, &st->cfg.schema, arr, &meta, false, err))
        return false;
    const uint64_t hlen = meta.header_size, len = meta.total_size - meta.header_size;
    const uint64_t cb = m->chunk_bytes, nchunks = (len + cb - 1) / cb;
    if (nchunks > WH__MAX_CHUNKS)
        return wh_err_set(err, WH_E_TOOBIG,
                          "sample of %llu bytes needs %llu chunks of CHUNKSIZE %llu bytes, more "
                          "than the %u a sample may have; raise CHUNKSIZE",
                          (unsigned long long)len, (unsigned long long)nchunks,
                          (unsigned long long)cb, WH__MAX_CHUNKS);
    const unsigned char *data = m->buf + hlen;

    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "put");
    const uint64_t w = s.write_gen;
    if (genp) *genp = w;
    bool full;
    if (!wh__gen_full(m, w, &full, NULL, err)) return wh_err_prefix(err, "put");
    if (full) { /* surplus: nothing written */
        *status = WH_PUT_DISCARDED;
        return wh__inc_discarded(m, err);
    }

    mongoc_collection_t *c = wh__gen_coll(m, w, false), *mc = wh__gen_coll(m, w, true);
    bool ok = true, dup = false, accepted = false;
    int64_t sid = 0;
    /* chunks first, under a fresh sample id: invisible until the manifest */
    for (int attempt = 0; attempt < 3; attempt++) {
        sid = (int64_t)(wh__rand64() >> 1) | 1;
        uint64_t half = (nchunks + 1) / 2;
        ok = wh__insert_chunks(m, c, sid, data, len, cb, 0, half, &dup, err);
        if (ok) {
            wh_fault_put_midway();
            ok = wh__insert_chunks(m, c, sid, data, len, cb, half, nchunks, &dup, err);
        }
        if (ok || !dup) break;
        /* a 63-bit id collided: drop what we wrote and pick another */
        wh__delete_chunks(m, c, sid, nchunks, NULL);
    }
    if (!ok) {
        wh__delete_chunks(m, c, sid, nchunks, NULL);
        goto out;
    }

    uint64_t pos = 0;
    ok = wh__claim(m, c, &pos, err);
    if (ok && pos < st->cfg.swap_cap) {
        wh_sample_set_place(m->buf, &meta, w, (uint32_t)pos);
        ok = wh__insert_manifest(m, mc, (uint32_t)pos, sid, nchunks, len, cb, m->buf, hlen,
                                 &accepted, err);
    }
    /* Counter past the end (or our slot taken): fill a hole left by a
     * generator that died between counter and manifest, if any. */
    for (int tries = 0; ok && !accepted && tries < WH__REPAIR_TRIES; tries++) {
        uint32_t hole = 0;
        uint64_t nholes = 0;
        ok = wh__find_hole(m, mc, &hole, &nholes, err);
        if (!ok || nholes == 0) break;
        wh_sample_set_place(m->buf, &meta, w, hole);
        ok = wh__insert_manifest(m, mc, hole, sid, nchunks, len, cb, m->buf, hlen, &accepted,
                                 err);
    }
    if (ok && accepted) {
        /* A put that outlived two seals may have committed into a generation
         * already reclaimed (its collection recreated by our writes): that
         * sample is not part of any generation. */
        wh__state_t now;
        bool exists = false;
        ok = wh__state_get(m, false, &now, &exists, err);
        if (ok && !(exists && (w == now.write_gen || w == now.read_gen || w == now.retiring)))
            accepted = false;
        else if (ok)
            goto out; /* committed */
    }
    if (ok) {
        ok = wh__delete_chunks(m, c, sid, nchunks, err);
        if (ok) ok = wh__inc_discarded(m, err);
    }
out:
    mongoc_collection_destroy(c);
    mongoc_collection_destroy(mc);
    if (!ok) return wh_err_prefix(err, "put into generation %llu", (unsigned long long)w);
    *status = accepted ? WH_PUT_ACCEPTED : WH_PUT_DISCARDED;
    return true;
}

/* ---- manager: lease and seal ---- */

/* A lease document no manager could have written: expires not a number,
 * or further ahead than its holder's lease_ms (at most the config's bound
 * of 1e6 s) allows. Left alone it would stop every manager from leading. */
static bool wh__lease_forged(const bson_t *doc, int64_t now_ms) {
    int64_t exp = 0, len = 0;
    if (!wh__get_int(doc, "expires", &exp)) return true;
    if (!wh__get_int(doc, "lease_ms", &len) || len < 0 || len > 1000000000) len = 1000000000;
    return exp > now_ms + len + 1000;
}

/* Removes the lease document if it is still the forged one we read (the
 * filter matches its owner and expires exactly, so a real manager's fresh
 * lease is never removed). */
static bool wh__drop_forged_lease(wh__mongo_t *m, mongoc_collection_t *c, const bson_t *doc,
                                  wh_err_t *err) {
    bson_t sel = BSON_INITIALIZER;
    BSON_APPEND_UTF8(&sel, "_id", "lease");
    bson_iter_t it;
    if (bson_iter_init_find(&it, doc, "expires")) {
        bson_append_iter(&sel, "expires", -1, &it);
    } else {
        bson_t ex;
        BSON_APPEND_DOCUMENT_BEGIN(&sel, "expires", &ex);
        BSON_APPEND_BOOL(&ex, "$exists", false);
        bson_append_document_end(&sel, &ex);
    }
    if (bson_iter_init_find(&it, doc, "owner")) bson_append_iter(&sel, "owner", -1, &it);
    bson_error_t e;
    bool ok = mongoc_collection_delete_one(c, &sel, NULL, NULL, &e);
    bson_destroy(&sel);
    return ok || wh__merr(m, err, &e, "remove a forged manager lease");
}

static bool wh__mongo_lead(wh_store_t *st, bool *leader, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    int64_t now = (int64_t)(wh_now_real_ns() / 1000000);
    int64_t len = (int64_t)(st->cfg.lease_s * 1000.0), exp = now + len;
    mongoc_collection_t *c = wh__state_coll(m);
    /* ours, or expired, or absent (the upsert inserts it); a live lease of
     * another owner makes the upsert collide on _id */
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("lease"), "$or", "[", "{", "owner",
                           BCON_INT64((int64_t)m->token), "}", "{", "expires", "{", "$lt",
                           BCON_INT64(now), "}", "}", "]");
    bson_t *upd = BCON_NEW("$set", "{", "owner", BCON_INT64((int64_t)m->token), "expires",
                           BCON_INT64(exp), "lease_ms", BCON_INT64(len), "pid",
                           BCON_INT64((int64_t)m->pid), "host", BCON_UTF8(m->host), "}");
    bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
    bool ok = true;
    *leader = false;
    for (int attempt = 0; ok && attempt < 2; attempt++) {
        bson_t reply;
        bson_error_t e;
        bool done = mongoc_collection_update_one(c, sel, upd, opts, &reply, &e);
        if (done) {
            int64_t matched = 0;
            wh__get_int(&reply, "matchedCount", &matched);
            bson_iter_t it;
            *leader = matched > 0 || bson_iter_init_find(&it, &reply, "upsertedId");
        } else if (!wh__is_dup(&e)) {
            ok = wh__merr(m, err, &e, "acquire manager lease");
        }
        bson_destroy(&reply);
        if (done || !ok) break;
        /* held by another: a real lease, or one no manager could have written */
        bson_t q = BSON_INITIALIZER, doc = BSON_INITIALIZER;
        BSON_APPEND_UTF8(&q, "_id", "lease");
        bool found = false;
        ok = wh__find_one(m, c, &q, &doc, &found, "read manager lease", err);
        bool forged = ok && found && wh__lease_forged(&doc, now);
        if (forged) ok = wh__drop_forged_lease(m, c, &doc, err);
        bson_destroy(&q);
        bson_destroy(&doc);
        if (!forged) break;
    }
    bson_destroy(sel);
    bson_destroy(upd);
    bson_destroy(opts);
    mongoc_collection_destroy(c);
    return ok;
}

static bool wh__mongo_resign(wh_store_t *st, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("lease"), "owner", BCON_INT64((int64_t)m->token));
    bson_error_t e;
    bool ok = mongoc_collection_delete_one(c, sel, NULL, NULL, &e);
    if (!ok) wh__merr(m, err, &e, "give up manager lease");
    bson_destroy(sel);
    mongoc_collection_destroy(c);
    return ok;
}

/* The lease document; *live false when absent or expired. */
static bool wh__lease_get(wh__mongo_t *m, uint64_t *owner, uint64_t *pid, int64_t *left_ms,
                          bool *live, wh_err_t *err) {
    mongoc_collection_t *c = wh__state_coll(m);
    bson_t *filter = BCON_NEW("_id", BCON_UTF8("lease"));
    bson_t doc = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, c, filter, &doc, &found, "read manager lease", err);
    *live = false;
    if (ok && found) {
        int64_t exp = 0, o = 0, p = 0;
        int64_t now = (int64_t)(wh_now_real_ns() / 1000000);
        wh__get_int(&doc, "owner", &o);
        wh__get_int(&doc, "pid", &p);
        if (wh__get_int(&doc, "expires", &exp) && exp >= now) {
            *live = true;
            *owner = (uint64_t)o;
            *pid = p > 0 ? (uint64_t)p : 1;
            *left_ms = exp - now;
        }
    }
    bson_destroy(&doc);
    bson_destroy(filter);
    mongoc_collection_destroy(c);
    return ok;
}

/* Drops generation collections older than keep_from except keep (the
 * retiring generation). Also catches collections a stale writer recreated. */
static bool wh__sweep(wh__mongo_t *m, uint64_t keep_from, uint64_t keep, wh_err_t *err) {
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    char **names = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    if (!names) return wh__merr(m, err, &e, "list collections");
    char pre[WH__NAME_MAX];
    int plen = snprintf(pre, sizeof pre, "%s.gen.", m->prefix);
    bool ok = true;
    for (char **p = names; *p; p++) {
        if (strncmp(*p, pre, (size_t)plen) != 0) continue;
        const char *num = *p + plen;
        char *end;
        errno = 0;
        unsigned long long g = strtoull(num, &end, 10);
        if (errno || end == num || (*end && strcmp(end, ".m") != 0)) continue;
        if (g >= keep_from || g == keep) continue;
        mongoc_collection_t *c = wh__coll(m, *p);
        if (!mongoc_collection_drop_with_opts(c, NULL, &e) && e.code != 26 &&
            !strstr(e.message, "ns not found") && ok)
            ok = wh__merr(m, err, &e, "drop generation %llu", g);
        mongoc_collection_destroy(c);
    }
    bson_strfreev(names);
    return ok;
}

static bool wh__mongo_seal(wh_store_t *st, bool *sealed, wh_seal_info_t *info, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    *sealed = false;
    uint64_t t0 = wh_now_mono_ns();
    uint64_t owner = 0, pid = 0;
    int64_t left = 0;
    bool live = false;
    if (!wh__lease_get(m, &owner, &pid, &left, &live, err)) return wh_err_prefix(err, "seal");
    if (!live || owner != m->token)
        return wh_err_set(err, WH_E_LEASE, "seal: this manager does not hold the lease");
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return wh_err_prefix(err, "seal");
    uint64_t w = s.write_gen;
    bool full = false;
    if (!wh__gen_full(m, w, &full, NULL, err))
        return wh_err_prefix(err, "seal generation %llu", (unsigned long long)w);
    if (!full) return true;

    uint64_t cap = st->cfg.swap_cap;
    uint64_t seal_ns = wh_now_mono_ns() - t0;
    uint64_t generated = s.generated + cap;
    mongoc_collection_t *c = wh__state_coll(m);
    /* The swap: one single-document update, conditional on nobody having
     * sealed w meanwhile. */
    bson_t *sel = BCON_NEW("_id", BCON_UTF8("state"), "write_gen", BCON_INT64((int64_t)w));
    bson_t *upd = BCON_NEW(
        "$set", "{", "read_gen", BCON_INT64((int64_t)w), "write_gen", BCON_INT64((int64_t)w + 1),
        "retiring", BCON_INT64((int64_t)s.read_gen), "}",
        "$inc", "{", "seals", BCON_INT64(1), "generated", BCON_INT64((int64_t)cap), "}",
        "$push", "{", "history", "{", "$each", "[", "{",
        "generation", BCON_INT64((int64_t)w), "time_ns", BCON_INT64((int64_t)wh_now_real_ns()),
        "generated", BCON_INT64((int64_t)generated),
        "discarded", BCON_INT64((int64_t)s.discarded),
        "seal_ns", BCON_INT64((int64_t)seal_ns), "}", "]",
        "$slice", BCON_INT32(-WH__HIST), "}", "}");
    bson_t reply;
    bson_error_t e;
    bool ok = mongoc_collection_update_one(c, sel, upd, NULL, &reply, &e);
    int64_t matched = 0;
    if (ok) wh__get_int(&reply, "matchedCount", &matched);
    else wh__merr(m, err, &e, "seal generation %llu", (unsigned long long)w);
    bson_destroy(&reply);
    bson_destroy(sel);
    bson_destroy(upd);
    mongoc_collection_destroy(c);
    if (!ok) return false;
    if (matched != 1) return true; /* sealed by someone else, or wiped */
    if (w > m->known_read) m->known_read = w;
    *sealed = true;
    info->generation = w;
    info->generated = generated;
    info->discarded = s.discarded;
    info->seal_ns = seal_ns;
    /* Reclaim: keep w (read), s.read_gen (retiring), w+1 (write). A failure
     * here is retried by the next seal's sweep; the seal itself stands. */
    wh_fault_seal_midway();
    wh_err_t ignored;
    wh__sweep(m, w, s.read_gen, &ignored);
    return true;
}

/* ---- reader ---- */

static bool wh__mongo_current(wh_store_t *st, uint64_t *gen, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return false;
    *gen = s.read_gen;
    return true;
}

/* Data of gen is missing: gone (reclaimed) or corrupt (gen still live). */
static bool wh__missing(wh__mongo_t *m, uint64_t gen, uint32_t pos, const char *what,
                        wh_err_t *err) {
    wh__state_t s;
    bool exists = false;
    if (!wh__state_get(m, false, &s, &exists, err)) return false;
    if (!exists || (gen != s.read_gen && gen != s.retiring))
        return wh_store_err_gone(err, gen);
    return wh_err_set(err, WH_E_CORRUPT, "generation %llu position %u: %s",
                      (unsigned long long)gen, pos, what);
}

static bool wh__corrupt(uint64_t gen, uint32_t pos, wh_err_t *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool wh__corrupt(uint64_t gen, uint32_t pos, wh_err_t *err, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return wh_err_set(err, WH_E_CORRUPT, "generation %llu position %u: %s",
                      (unsigned long long)gen, pos, what);
}

/* Copies one chunk's bytes (sample offsets [start, start+len)) into the
 * field buffers it overlaps. */
static void wh__scatter(const wh_sample_meta_t *meta, void *const *dst, uint64_t start,
                        const uint8_t *src, uint64_t len) {
    uint64_t end = start + len;
    for (int i = 0; i < meta->nfields; i++) {
        const wh_field_meta_t *f = &meta->f[i];
        if (!dst[i] || !f->nbytes) continue;
        uint64_t a = f->offset > start ? f->offset : start;
        uint64_t b = f->offset + f->nbytes < end ? f->offset + f->nbytes : end;
        if (a < b) memcpy((char *)dst[i] + (a - f->offset), src + (a - start), b - a);
    }
}

typedef struct {
    int64_t sid;                 /* the sample's chunk id */
    uint64_t cb, nchunks, dlen;  /* chunk size, chunk count, data bytes */
} wh__manifest_t;

/* A manifest document checked against the schema, the place it was read
 * from and the store's limits, without I/O (fuzzed on its own); meta gets
 * the sample's layout. */
static bool wh__parse_manifest(const bson_t *man, const wh_schema_t *schema, uint64_t gen,
                               uint32_t pos, wh__manifest_t *out, wh_sample_meta_t *meta,
                               wh_err_t *err) {
    int64_t sid = 0, k = 0, z = 0, b = 0;
    const uint8_t *hdr = NULL;
    uint32_t hlen = 0;
    bson_iter_t it;
    if (bson_iter_init_find(&it, man, "h") && BSON_ITER_HOLDS_BINARY(&it))
        bson_iter_binary(&it, NULL, &hlen, &hdr);
    if (!wh__get_int(man, "s", &sid) || !wh__get_int(man, "k", &k) ||
        !wh__get_int(man, "z", &z) || !wh__get_int(man, "b", &b) || !hdr)
        return wh__corrupt(gen, pos, err, "manifest lacks s, k, z, b or h");
    if (!wh_sample_decode_meta(hdr, hlen, schema, gen, pos, meta, err))
        return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    uint64_t dlen = meta->total_size - meta->header_size;
    if (hlen != meta->header_size)
        return wh__corrupt(gen, pos, err, "manifest header is %u bytes, its layout says %llu",
                           hlen, (unsigned long long)meta->header_size);
    if (z < 0 || (uint64_t)z != dlen)
        return wh__corrupt(gen, pos, err, "manifest says %lld data bytes, header says %llu",
                           (long long)z, (unsigned long long)dlen);
    if (b < 1 || b > (int64_t)WH__MAX_CHUNK)
        return wh__corrupt(gen, pos, err, "manifest chunk size %lld out of range", (long long)b);
    uint64_t cb = (uint64_t)b, nchunks = (dlen + cb - 1) / cb;
    if (k < 0 || (uint64_t)k != nchunks)
        return wh__corrupt(gen, pos, err, "manifest says %lld chunks, sizes need %llu",
                           (long long)k, (unsigned long long)nchunks);
    if (nchunks > WH__MAX_CHUNKS)
        return wh__corrupt(gen, pos, err, "manifest claims %llu chunks, at most %u are written",
                           (unsigned long long)nchunks, WH__MAX_CHUNKS);
    *out = (wh__manifest_t){sid, cb, nchunks, dlen};
    return true;
}

/* A chunk document of the sample mf describes, checked without I/O (fuzzed
 * on its own): its id, that it was not seen before (seen: nchunks flags),
 * and its length. */
static bool wh__parse_chunk(const bson_t *doc, const wh__manifest_t *mf, const unsigned char *seen,
                            uint64_t gen, uint32_t pos, int64_t *dc, const uint8_t **bytes,
                            uint32_t *blen, wh_err_t *err) {
    int64_t ds = 0;
    *dc = -1;
    *bytes = NULL;
    *blen = 0;
    if (!wh__get_int(doc, "_id.s", &ds) || !wh__get_int(doc, "_id.c", dc) || ds != mf->sid)
        return wh__corrupt(gen, pos, err, "chunk document with a malformed _id");
    if (*dc < 0 || (uint64_t)*dc >= mf->nchunks || seen[*dc])
        return wh__corrupt(gen, pos, err, "unexpected chunk %lld (sample has %llu)",
                           (long long)*dc, (unsigned long long)mf->nchunks);
    bson_iter_t it;
    if (bson_iter_init_find(&it, doc, "d") && BSON_ITER_HOLDS_BINARY(&it))
        bson_iter_binary(&it, NULL, blen, bytes);
    uint64_t off = (uint64_t)*dc * mf->cb;
    uint64_t want = mf->dlen - off < mf->cb ? mf->dlen - off : mf->cb;
    if (!*bytes || *blen != want)
        return wh__corrupt(gen, pos, err, "chunk %lld holds %u bytes, manifest expects %llu",
                           (long long)*dc, *bytes ? *blen : 0, (unsigned long long)want);
    return true;
}

static bool wh__mongo_read(wh_store_t *st, uint64_t gen, uint32_t pos, wh_dest_fn fn, void *ctx,
                           wh_sample_meta_t *meta_out, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    const wh_schema_t *schema = &st->cfg.schema;
    if (pos >= st->cfg.swap_cap)
        return wh_err_set(err, WH_E_INVALID, "position %u out of range (SWAP_CAP=%u)", pos,
                          st->cfg.swap_cap);
    if (gen == 0 || gen > m->known_read) {
        wh__state_t s;
        if (!wh__state_get(m, true, &s, NULL, err)) return false;
        if (gen == 0 || (gen > s.read_gen && gen >= s.write_gen))
            return wh_err_set(err, WH_E_NOTFOUND, "generation %llu is not sealed (newest is %llu)",
                              (unsigned long long)gen, (unsigned long long)s.read_gen);
        if (gen > s.read_gen) /* older epoch of a wiped database */
            return wh_store_err_gone(err, gen);
    }

    /* manifest */
    mongoc_collection_t *mc = wh__gen_coll(m, gen, true);
    bson_t *filter = BCON_NEW("_id", BCON_INT32((int32_t)pos));
    bson_t man = BSON_INITIALIZER;
    bool found = false;
    bool ok = wh__find_one(m, mc, filter, &man, &found, "read manifest", err);
    bson_destroy(filter);
    mongoc_collection_destroy(mc);
    if (!ok) {
        bson_destroy(&man);
        return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
    }
    if (!found) {
        bson_destroy(&man);
        return wh__missing(m, gen, pos, "manifest missing", err);
    }
    wh__manifest_t mf = {0};
    wh_sample_meta_t meta;
    ok = wh__parse_manifest(&man, schema, gen, pos, &mf, &meta, err);
    bson_destroy(&man);
    if (!ok) return false;
    const int64_t sid = mf.sid;
    const uint64_t cb = mf.cb, nchunks = mf.nchunks, dlen = mf.dlen;

    /* a large claim is confirmed before memory is allocated for it: the
     * chunks must exist, so a forged manifest costs a count, not its size */
    if (fn && dlen >= WH__CONFIRM_BYTES) {
        bson_t q = BSON_INITIALIZER;
        wh__chunk_filter(&q, sid, nchunks);
        mongoc_collection_t *c = wh__gen_coll(m, gen, false);
        bson_error_t e;
        int64_t have = mongoc_collection_count_documents(c, &q, NULL, NULL, NULL, &e);
        mongoc_collection_destroy(c);
        bson_destroy(&q);
        if (have < 0)
            return wh__merr(m, err, &e, "read generation %llu position %u",
                            (unsigned long long)gen, pos);
        if ((uint64_t)have != nchunks) {
            char what[160];
            snprintf(what, sizeof what, "manifest claims %llu bytes in %llu chunks, %lld exist",
                     (unsigned long long)dlen, (unsigned long long)nchunks, (long long)have);
            return wh__missing(m, gen, pos, what, err);
        }
    }
    void *dst[WH_MAX_FIELDS] = {0};
    if (fn && !fn(ctx, &meta, dst, err)) return false;
    bool any = false;
    for (int i = 0; i < meta.nfields; i++) any |= dst[i] != NULL && meta.f[i].nbytes > 0;

    if (any && nchunks) {
        if (!wh__grow(&m->seen, &m->seen_cap, nchunks, err)) return false;
        memset(m->seen, 0, nchunks);
        bson_t q = BSON_INITIALIZER;
        wh__chunk_filter(&q, sid, nchunks);
        uint64_t per = WH__BATCH_BYTES / (cb + 256);
        if (per < 1) per = 1;
        if (per > nchunks) per = nchunks;
        bson_t *opts = BCON_NEW("batchSize", BCON_INT32((int32_t)per));
        mongoc_collection_t *c = wh__gen_coll(m, gen, false);
        mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, &q, opts, NULL);
        const bson_t *doc;
        uint64_t got = 0;
        bool bad = false;
        while (!bad && mongoc_cursor_next(cur, &doc)) {
            int64_t dc = -1;
            const uint8_t *bytes = NULL;
            uint32_t blen = 0;
            if (!wh__parse_chunk(doc, &mf, m->seen, gen, pos, &dc, &bytes, &blen, err)) {
                bad = true;
                break;
            }
            uint64_t off = (uint64_t)dc * cb;
            m->seen[dc] = 1;
            got++;
            wh__scatter(&meta, dst, meta.header_size + off, bytes, blen);
        }
        bson_error_t e;
        bool cerr = !bad && mongoc_cursor_error(cur, &e);
        mongoc_cursor_destroy(cur);
        mongoc_collection_destroy(c);
        bson_destroy(opts);
        bson_destroy(&q);
        if (bad) return false;
        if (cerr) {
            if (wh__is_unavail(&e))
                return wh__merr(m, err, &e, "read generation %llu position %u",
                                (unsigned long long)gen, pos);
            /* a cursor killed by a drop reads as gone */
            wh_err_t tmp;
            if (!wh__missing(m, gen, pos, "chunk cursor failed", &tmp) && tmp.code == WH_E_GONE) {
                *err = tmp;
                return false;
            }
            return wh__merr(m, err, &e, "read generation %llu position %u",
                            (unsigned long long)gen, pos);
        }
        if (got != nchunks) {
            char what[128];
            snprintf(what, sizeof what, "%llu of %llu chunks missing",
                     (unsigned long long)(nchunks - got), (unsigned long long)nchunks);
            return wh__missing(m, gen, pos, what, err);
        }
    }
    for (int i = 0; i < meta.nfields; i++) {
        if (!dst[i]) continue;
        if (st->cfg.verify_reads && !wh_sample_verify(schema, &meta, i, dst[i], err))
            return wh_err_prefix(err, "generation %llu position %u", (unsigned long long)gen, pos);
        wh_count_out(meta.f[i].nbytes);
    }
    if (meta_out) *meta_out = meta;
    return true;
}

/* ---- status ---- */

static bool wh__mongo_status(wh_store_t *st, wh_status_t *o, wh_err_t *err) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    memset(o, 0, sizeof *o);
    wh__state_t s;
    if (!wh__state_get(m, true, &s, NULL, err)) return false;
    uint64_t fill = 0;
    bool full = false;
    if (!wh__gen_full(m, s.write_gen, &full, &fill, err)) return false;
    uint64_t owner = 0, pid = 0;
    int64_t left = 0;
    bool live = false;
    if (!wh__lease_get(m, &owner, &pid, &left, &live, err)) return false;
    o->read_gen = s.read_gen;
    o->write_gen = s.write_gen;
    o->write_fill = (uint32_t)(fill < st->cfg.swap_cap ? fill : st->cfg.swap_cap);
    o->swap_cap = st->cfg.swap_cap;
    o->write_bytes = 0; /* the server holds the bytes; no budget here */
    o->byte_budget = 0;
    o->generated = s.generated + o->write_fill;
    o->discarded = s.discarded;
    o->seals = s.seals;
    if (live) {
        o->leader_pid = pid;
        o->lease_left_s = (double)left / 1000.0;
    }
    o->nhistory = s.nhist;
    for (int i = 0; i < s.nhist; i++) {
        o->history[i].generation = s.hist[i].generation;
        o->history[i].time_ns = s.hist[i].time_ns;
        o->history[i].generated = s.hist[i].generated;
        o->history[i].discarded = s.hist[i].discarded;
        o->history[i].seal_ns = s.hist[i].seal_ns;
    }
    return true;
}

/* ---- open / clean / destroy ---- */

static void wh__mongo_destroy(wh_store_t *st) {
    wh__mongo_t *m = (wh__mongo_t *)st;
    if (!m) return;
    if (m->client) {
        /* in a forked child the socket is the parent's: drop it unused */
        if (getpid() != m->pid) mongoc_client_reset(m->client);
        mongoc_client_destroy(m->client);
    }
    free(m->buf);
    free(m->seen);
    free(m);
}

static bool wh__check_cfg(const wh_store_config_t *cfg, wh_err_t *err) {
    const char *p = cfg->prefix && *cfg->prefix ? cfg->prefix : "wirehead";
    if (strlen(p) > 100)
        return wh_err_set(err, WH_E_INVALID, "collection prefix '%.40s...' is too long", p);
    if (strchr(p, '$'))
        return wh_err_set(err, WH_E_INVALID, "collection prefix '%s' may not contain '$'", p);
    return true;
}

static wh__mongo_t *wh__new(const wh_store_config_t *cfg, wh_err_t *err) {
    if (!wh__check_cfg(cfg, err)) return NULL;
    wh__mongo_t *m = calloc(1, sizeof *m);
    if (!m) return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    m->base.ops = &wh__mongo_ops;
    m->base.cfg = *cfg;
    m->pid = getpid();
    m->token = wh__rand64() >> 1 | 1;
    snprintf(m->prefix, sizeof m->prefix, "%s",
             cfg->prefix && *cfg->prefix ? cfg->prefix : "wirehead");
    if (gethostname(m->host, sizeof m->host) != 0) snprintf(m->host, sizeof m->host, "?");
    m->host[sizeof m->host - 1] = '\0';
    if (!wh__connect(m, cfg, err)) {
        wh__mongo_destroy(&m->base);
        return NULL;
    }
    return m;
}

wh_store_t *wh_mongo_open(const wh_store_config_t *cfg, wh_err_t *err) {
    uint64_t cb = cfg->chunk_bytes ? cfg->chunk_bytes : WH__DEFAULT_CHUNK;
    if (cb > WH__MAX_CHUNK)
        return wh_err_set(err, WH_E_INVALID,
                          "CHUNKSIZE of %llu bytes is too large for a MongoDB document; use at "
                          "most %u bytes (15.98 MiB)",
                          (unsigned long long)cb, WH__MAX_CHUNK),
               NULL;
    wh__mongo_t *m = wh__new(cfg, err);
    if (!m) return NULL;
    m->chunk_bytes = cb;
    /* Reaches the server (bounded by the connect timeout), creates the state
     * on first use and checks the schema. */
    wh__state_t s;
    bool exists = true;
    if (!wh__state_get(m, !cfg->no_create, &s, &exists, err) ||
        (!exists && !wh_err_set(err, WH_E_NOTFOUND, "no such store (no state document)"))) {
        wh_err_prefix(err, "open store '%s'", m->prefix);
        wh__mongo_destroy(&m->base);
        return NULL;
    }
    return &m->base;
}

bool wh_mongo_clean(const wh_store_config_t *cfg, wh_err_t *err) {
    wh__mongo_t *m = wh__new(cfg, err);
    if (!m) return false;
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    /* listCollections filters are not honoured everywhere: filter here */
    char **names = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    bool ok = true;
    if (!names) {
        ok = wh__merr(m, err, &e, "clean store '%s': list collections", m->prefix);
    } else {
        char state[WH__NAME_MAX], gen[WH__NAME_MAX];
        snprintf(state, sizeof state, "%s.state", m->prefix);
        int glen = snprintf(gen, sizeof gen, "%s.gen.", m->prefix);
        for (char **p = names; *p && ok; p++) {
            bool ours = strcmp(*p, state) == 0;
            if (!ours && strncmp(*p, gen, (size_t)glen) == 0) {
                const char *q = *p + glen;
                size_t digits = strspn(q, "0123456789");
                ours = digits > 0 && (q[digits] == '\0' || strcmp(q + digits, ".m") == 0);
            }
            if (!ours) continue;
            mongoc_collection_t *c = wh__coll(m, *p);
            if (!mongoc_collection_drop_with_opts(c, NULL, &e) && e.code != 26 &&
                !strstr(e.message, "ns not found"))
                ok = wh__merr(m, err, &e, "clean store '%s': drop %s", m->prefix, *p);
            mongoc_collection_destroy(c);
        }
        bson_strfreev(names);
    }
    wh__mongo_destroy(&m->base);
    return ok;
}

/* The database's collection names (to tell a user whose database holds
 * another layout, e.g. the original wirehead's, what they are looking at).
 * *names is owned by the caller: wh_mongo_names_free. */
bool wh_mongo_collections(const wh_store_config_t *cfg, char ***names, wh_err_t *err) {
    wh__mongo_t *m = wh__new(cfg, err);
    if (!m) return false;
    mongoc_database_t *db = mongoc_client_get_database(m->client, m->db);
    bson_error_t e;
    *names = mongoc_database_get_collection_names_with_opts(db, NULL, &e);
    mongoc_database_destroy(db);
    bool ok = *names != NULL || wh__merr(m, err, &e, "list collections of '%s'", m->db);
    wh__mongo_destroy(&m->base);
    return ok;
}

void wh_mongo_names_free(char **names) { bson_strfreev(names); }

static const wh_store_ops_t wh__mongo_ops = {
    .scheme = "mongodb",
    .put = wh__mongo_put,
    .lead = wh__mongo_lead,
    .resign = wh__mongo_resign,
    .seal = wh__mongo_seal,
    .current = wh__mongo_current,
    .read = wh__mongo_read,
    .status = wh__mongo_status,
    .destroy = wh__mongo_destroy,
};
