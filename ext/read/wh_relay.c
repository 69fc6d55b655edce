/* The relay's copy of one generation (wh_relay.h). */
#include "wh_relay.h"

#include <string.h>

typedef struct {
    wh_store_t *dst;
    uint64_t gen, budget, bytes;
    uint32_t pos;
    bool begun;
} wh__pull_t;

/* BYTE_BUDGET auto's rule (wh_shm_seg.c) applied to the first sample mirrored. */
static uint64_t wh__budget(const wh_sample_meta_t *meta, uint32_t swap_cap) {
    uint64_t per = 0, all = 0;
    if (!wh_mul_ok(meta->total_size + meta->total_size / 4, swap_cap, &per) ||
        !wh_add_ok(per, 1u << 20, &all) || all > (1ull << 62))
        return 0;
    return (all + 4095) & ~(uint64_t)4095;
}

static bool wh__pull_dst(void *ctx, const wh_sample_meta_t *meta, void **dst, wh_err_t *err) {
    wh__pull_t *p = ctx;
    if (!p->begun) {
        uint32_t cap = wh_store_config(p->dst)->swap_cap;
        uint64_t budget = p->budget ? p->budget : wh__budget(meta, cap);
        if (!budget)
            return wh_err_set(err, WH_E_TOOBIG, "SWAP_CAP=%u samples of %llu bytes overflow", cap,
                              (unsigned long long)meta->total_size);
        if (!wh_store_mirror_begin(p->dst, p->gen, budget, err)) return false;
        p->begun = true;
    }
    if (!wh_store_mirror_reserve(p->dst, p->gen, p->pos, meta->total_size, dst, err)) return false;
    p->bytes += meta->total_size;
    return true;
}

bool wh_relay_pull(wh_store_t *src, wh_store_t *dst, uint64_t gen, uint64_t budget, double wait_s,
                   wh_relay_info_t *info, wh_err_t *err) {
    const wh_store_config_t *sc = wh_store_config(src), *dc = wh_store_config(dst);
    uint64_t t0 = wh_now_mono_ns();
    memset(info, 0, sizeof *info);
    if (sc->swap_cap != dc->swap_cap || sc->schema.hash != dc->schema.hash)
        return wh_err_set(err, WH_E_SCHEMA,
                          "the local store's SWAP_CAP or SAMPLE differ from the store it mirrors");
    wh__pull_t p = {.dst = dst, .gen = gen, .budget = budget};
    for (uint32_t pos = 0; pos < sc->swap_cap; pos++) {
        p.pos = pos;
        if (!wh_store_read_encoded(src, gen, pos, wh__pull_dst, &p, NULL, err) ||
            !wh_store_mirror_commit(dst, gen, pos, err))
            return false;
    }
    /* readers pinning old areas can hold a seal back a while */
    uint64_t deadline = wh_now_mono_ns() + (uint64_t)(wait_s * 1e9);
    for (;;) {
        bool leader = false, sealed = false;
        wh_seal_info_t si = {0};
        if (!wh_store_lead(dst, &leader, err)) return false;
        if (!leader) return wh_err_set(err, WH_E_LEASE, "another relay took the local store over");
        if (!wh_store_seal(dst, &sealed, &si, err)) return false;
        if (sealed && si.generation != gen)
            return wh_err_set(err, WH_E_INTERNAL, "sealed generation %llu, mirrored %llu",
                              (unsigned long long)si.generation, (unsigned long long)gen);
        if (sealed) break;
        if (wh_now_mono_ns() >= deadline)
            return wh_err_set(err, WH_E_PINNED,
                              "generation %llu mirrored but not sealed after %gs: reader pid "
                              "%llu pins the local area it needs",
                              (unsigned long long)gen, wait_s, (unsigned long long)si.blocked_pid);
        wh_sleep_ms(2);
    }
    info->gen = gen;
    info->samples = sc->swap_cap;
    info->bytes = p.bytes;
    info->ns = wh_now_mono_ns() - t0;
    return true;
}
