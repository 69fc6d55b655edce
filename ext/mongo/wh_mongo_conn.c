/* MongoDB backend: what its other files stand on — libmongoc's process-wide
 * setup (logging without credentials, memory for large replies), the client
 * connection, error texts, collection names and BSON getters. Calls nothing
 * in the backend's other files. */
#define _GNU_SOURCE
#include "wh_mongo_int.h"

/* ---- process-wide setup ---- */

static pthread_once_t wh__once = PTHREAD_ONCE_INIT;

/* libmongoc warnings go to stderr; URIs in them lose their credentials. */
static void wh__log(mongoc_log_level_t level, const char *domain, const char *message, void *data) {
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
#define WH__BIG_SLOTS 32                 /* big blocks tracked (live + idle) */
#define WH__BIG_KEEP ((size_t)256 << 20) /* most bytes kept idle */

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
    static const bson_mem_vtable_t vt = {wh__mem_malloc, wh__mem_calloc,  wh__mem_realloc,
                                         wh__mem_free,   wh__mem_aligned, {NULL, NULL, NULL}};
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

bool wh__is_unavail(const bson_error_t *e) {
    if (e->domain == MONGOC_ERROR_SERVER_SELECTION || e->domain == MONGOC_ERROR_STREAM) return true;
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
    default: return false;
    }
}

bool wh__is_dup(const bson_error_t *e) { return e->code == 11000 || e->code == 11001; }

/* Sets err from a libmongoc error: "<what>: <libmongoc message> (<where>)". */
bool wh__merr(const wh__mongo_t *m, wh_err_t *err, const bson_error_t *e, const char *fmt, ...) {
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

/* ---- small helpers ---- */

uint64_t wh__rand64(void) {
    uint64_t v;
    if (getrandom(&v, sizeof v, 0) != sizeof v)
        v = wh_now_real_ns() * 0x9E3779B97F4A7C15ull ^ ((uint64_t)getpid() << 17);
    return v;
}

static void wh__coll_name(char *out, size_t cap, const wh__mongo_t *m, uint64_t gen,
                          bool manifests) {
    snprintf(out, cap, "%s.gen.%llu%s", m->prefix, (unsigned long long)gen, manifests ? ".m" : "");
}

mongoc_collection_t *wh__coll(wh__mongo_t *m, const char *name) {
    return mongoc_client_get_collection(m->client, m->db, name);
}

mongoc_collection_t *wh__gen_coll(wh__mongo_t *m, uint64_t gen, bool manifests) {
    char name[WH__NAME_MAX];
    wh__coll_name(name, sizeof name, m, gen, manifests);
    return wh__coll(m, name);
}

mongoc_collection_t *wh__state_coll(wh__mongo_t *m) {
    char name[WH__NAME_MAX];
    snprintf(name, sizeof name, "%s.state", m->prefix);
    return wh__coll(m, name);
}

/* Integer value of key in doc (int32, int64 or an integral double). */
bool wh__get_int(const bson_t *doc, const char *key, int64_t *out) {
    bson_iter_t it;
    if (!bson_iter_init(&it, doc) || !bson_iter_find_descendant(&it, key, &it)) return false;
    switch (bson_iter_type(&it)) {
    case BSON_TYPE_INT32: *out = bson_iter_int32(&it); return true;
    case BSON_TYPE_INT64: *out = bson_iter_int64(&it); return true;
    case BSON_TYPE_DOUBLE: {
        double d = bson_iter_double(&it);
        if (d != d || d < -9.2e18 || d > 9.2e18 || (double)(int64_t)d != d) return false;
        *out = (int64_t)d;
        return true;
    }
    default: return false;
    }
}

uint64_t wh__get_u64_or0(const bson_t *doc, const char *key) {
    int64_t v = 0;
    return (wh__get_int(doc, key, &v) && v > 0) ? (uint64_t)v : 0;
}

/* First document matching filter into *out (bson_init'ed by the caller,
 * caller destroys); *found false when none. */
bool wh__find_one(wh__mongo_t *m, mongoc_collection_t *c, const bson_t *filter, bson_t *out,
                  bool *found, const char *what, wh_err_t *err) {
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

bool wh__mongo_connect(wh__mongo_t *m, const wh_store_config_t *cfg, wh_err_t *err) {
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
    m->wait_s =
        mongoc_uri_get_option_as_int32(uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, ms) / 1000.0;
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
