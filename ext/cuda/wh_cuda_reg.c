/* Store mappings and ring slot files registered in place with
 * cudaHostRegister (wh_cuda_int.h): one registration per process and
 * mapping, shared by every stage, and the ones each stage uses. */
#include "wh_cuda_int.h"

typedef struct wh__reg {
    void *map; /* wh_store_view_map's reference: keeps the mapping mapped */
    void *base;
    size_t len;
    uint32_t users;          /* stages using it */
    void (*drop)(void *map); /* lets go of map (after the unregister) */
    struct wh__reg *next;
} wh__reg_t;

static pthread_mutex_t wh__reg_mu = PTHREAD_MUTEX_INITIALIZER;
static wh__reg_t *wh__regs;
static uint64_t wh__registrations;

bool wh_cuda_can_register(void) { return wh_cudart.HostRegister != NULL; }

/* One more user of map's registration, registering it on first use. Takes
 * over the caller's map reference (drop lets go of it); what names the
 * mapping in messages. Registers on device. */
static bool wh__reg_take(void *map, const void *base, size_t len, void (*drop)(void *),
                         const char *what, int device, wh_err_t *err) {
    pthread_mutex_lock(&wh__reg_mu);
    wh__reg_t *r = wh__regs;
    while (r && r->map != map) r = r->next;
    if (r) {
        r->users++;
        pthread_mutex_unlock(&wh__reg_mu);
        drop(map);
        return true;
    }
    r = calloc(1, sizeof *r);
    int rc = -1;
    if (r) {
        unsigned flags = WH_CUDA_HOST_REGISTER_PORTABLE;
        if (wh_cuda_runtime_version() >= WH_CUDA_READ_ONLY_VERSION)
            flags |= WH_CUDA_HOST_REGISTER_READ_ONLY; /* the store's mapping is read-only */
        int prev = wh_cudart_enter(device);
        rc = wh_cudart.HostRegister((void *)base, len, flags);
        if (rc != WH_CUDA_SUCCESS) wh_cudart_clear();
        wh_cudart_leave(device, prev);
    }
    if (rc != WH_CUDA_SUCCESS) {
        pthread_mutex_unlock(&wh__reg_mu);
        free(r);
        drop(map);
        if (rc == -1) return wh_err_set(err, WH_E_SYS, "out of memory");
        return wh_err_set(err, WH_E_CUDA,
                          "cudaHostRegister of %s %zu-byte mapping was refused: %s "
                          "(error %d; the locked-memory limit, ulimit -l / RLIMIT_MEMLOCK, may "
                          "be below its size)",
                          what, len, wh_cudart_str(rc), rc);
    }
    r->map = map;
    r->base = (void *)base;
    r->len = len;
    r->users = 1;
    r->drop = drop;
    r->next = wh__regs;
    wh__regs = r;
    wh__registrations++;
    pthread_mutex_unlock(&wh__reg_mu);
    return true;
}

/* One user fewer; the last unregisters (no copy from it may be pending). */
void wh__gpu_reg_drop(void *map) {
    pthread_mutex_lock(&wh__reg_mu);
    wh__reg_t **rr = &wh__regs;
    while (*rr && (*rr)->map != map) rr = &(*rr)->next;
    wh__reg_t *r = *rr;
    if (r && --r->users == 0) {
        *rr = r->next;
        if (wh_cudart.HostUnregister(r->base) != WH_CUDA_SUCCESS) wh_cudart_clear();
    } else {
        r = NULL;
    }
    pthread_mutex_unlock(&wh__reg_mu);
    if (r) {
        r->drop(r->map);
        free(r);
    }
}

static void wh__store_map_drop(void *map) { wh_store_map_unref(map); }

static void wh__slot_map_drop(void *map) { wh_buf_unref(map); }

uint64_t wh__gpu_registrations(void) {
    pthread_mutex_lock(&wh__reg_mu);
    uint64_t n = wh__registrations;
    pthread_mutex_unlock(&wh__reg_mu);
    return n;
}

/* Stops using the registrations in maps[0, n): after every copy queued on
 * the stage's stream (some may read them) has completed. */
void wh__gpu_maps_drop(wh_gpu_t *g, void **maps, int n) {
    if (!n) return;
    int prev = wh_cudart_enter(g->device);
    wh_cudart.StreamSynchronize(g->stream);
    wh_cudart_leave(g->device, prev);
    for (int i = 0; i < n; i++) wh__gpu_reg_drop(maps[i]);
}

/* The registrations b's rows need, taken before its copies are queued.
 * One the stage used before and b does not is kept while the mapping is in
 * use (the loader's threads move to a segment made again one by one, so
 * batches alternate between the two for a while) and dropped once only the
 * registration holds it, or when the stage needs the room. */
bool wh__gpu_maps_for(wh_gpu_t *g, const wh_batch_t *b, wh_err_t *err) {
    void *want[WH__MAX_MAPS];
    const void *base[WH__MAX_MAPS];
    size_t len[WH__MAX_MAPS];
    int n = 0;
    bool ok = true;
    for (uint32_t i = 0; i < b->n && ok; i++) {
        const void *bs;
        size_t ln;
        void *m = wh_store_view_map(b->views[i], &bs, &ln);
        if (!m) {
            ok = wh_err_set(err, WH_E_INVALID, "row %u of the batch is not a store view", i);
            break;
        }
        int k = 0;
        while (k < n && want[k] != m) k++;
        if (k < n || n == WH__MAX_MAPS) {
            wh_store_map_unref(m);
            if (k == n) ok = wh_err_set(err, WH_E_INVALID, "a batch's rows span too many mappings");
            continue;
        }
        want[n] = m;
        base[n] = bs;
        len[n++] = ln;
    }
    /* new registrations first, then let go of the old */
    void *keep[WH__MAX_MAPS], *gone[WH__MAX_MAPS];
    int nkeep = 0, ngone = 0;
    for (int k = 0; k < n; k++) {
        int j = 0;
        while (j < g->nmaps && g->maps[j] != want[k]) j++;
        if (j < g->nmaps) {
            wh_store_map_unref(want[k]); /* already a user */
            keep[nkeep++] = want[k];
        } else if (!ok) {
            wh_store_map_unref(want[k]);
        } else if (wh__reg_take(want[k], base[k], len[k], wh__store_map_drop, "the store's",
                                g->device, err)) {
            keep[nkeep++] = want[k];
        } else {
            ok = false;
        }
    }
    for (int j = 0; j < g->nmaps; j++) {
        int k = 0;
        while (k < nkeep && keep[k] != g->maps[j]) k++;
        if (k < nkeep) continue;
        if (ok && nkeep < WH__MAX_MAPS && wh_store_map_in_use(g->maps[j]))
            keep[nkeep++] = g->maps[j];
        else
            gone[ngone++] = g->maps[j];
    }
    memcpy(g->maps, keep, (size_t)nkeep * sizeof *keep);
    g->nmaps = nkeep;
    wh__gpu_maps_drop(g, gone, ngone);
    return ok;
}

/* Lets go of slot mappings only this stage's registration still holds: the
 * ring moved on to a grown version, or was closed, and no batch over them
 * (so no copy from them, which holds its batch) is left. */
void wh__gpu_slots_sweep(wh_gpu_t *g) {
    size_t k = 0;
    for (size_t i = 0; i < g->nslots; i++) {
        wh_buf_t *m = g->slots[i];
        if (__atomic_load_n(&m->refs, __ATOMIC_ACQUIRE) == 1)
            wh__gpu_reg_drop(m);
        else
            g->slots[k++] = m;
    }
    g->nslots = k;
}

/* Whether m is registered for this stage, registering it on first use;
 * takes over the reference m. */
bool wh__gpu_slot_registered(wh_gpu_t *g, wh_buf_t *m, wh_err_t *err) {
    for (size_t i = 0; i < g->nslots; i++)
        if (g->slots[i] == m) {
            wh_buf_unref(m);
            return true;
        }
    if (g->nslots == g->capslots) {
        size_t nc = g->capslots ? 2 * g->capslots : 16;
        wh_buf_t **ns = realloc(g->slots, nc * sizeof *ns);
        if (!ns) {
            wh_buf_unref(m);
            return wh_err_set(err, WH_E_SYS, "out of memory");
        }
        g->slots = ns;
        g->capslots = nc;
    }
    if (!wh__reg_take(m, m->data, m->size, wh__slot_map_drop, "a ring slot file's", g->device, err))
        return false;
    g->slots[g->nslots++] = m;
    return true;
}
