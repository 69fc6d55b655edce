/* A loader's batches on a device (wh_cuda.h, wh_gpu_feed_*): copied
 * ahead through the stage. */
#include "wh_cuda_int.h"

struct wh_gpu_feed {
    wh_gpu_t *g;
    wh_loader_t *ld;
    uint32_t depth, head, n;
    bool done;
    wh_batch_t *q;
    bool *pad;
};

wh_gpu_feed_t *wh_gpu_feed_new(wh_gpu_t *g, wh_loader_t *ld, uint32_t depth, wh_err_t *err) {
    wh_gpu_feed_t *f = calloc(1, sizeof *f);
    if (f) {
        f->q = calloc(depth ? depth : 1, sizeof *f->q);
        f->pad = calloc(depth ? depth : 1, sizeof *f->pad);
    }
    if (!f || !f->q || !f->pad) {
        if (f) free(f->q);
        free(f);
        return wh_err_set(err, WH_E_SYS, "out of memory"), NULL;
    }
    f->g = g;
    f->ld = ld;
    f->depth = depth ? depth : 1;
    return f;
}

void wh_gpu_feed_reset(wh_gpu_feed_t *f) {
    for (; f->n; f->n--, f->head = (f->head + 1) % f->depth) wh_buf_unref(f->q[f->head].buf);
    f->head = 0;
    f->done = false;
}

void wh_gpu_feed_destroy(wh_gpu_feed_t *f) {
    if (!f) return;
    wh_gpu_feed_reset(f);
    free(f->q);
    free(f->pad);
    free(f);
}

bool wh_gpu_feed_next(wh_gpu_feed_t *f, unsigned wait_ms, wh_batch_t *out, bool *done,
                      bool *any_pad, wh_err_t *err) {
    *done = false;
    out->buf = NULL;
    wh_gpu_poll(f->g); /* slots whose copies completed go back to the ring first */
    /* issue the copies of every batch already read, up to depth ahead; block
     * (up to wait_ms) only when none is queued */
    while (!f->done && f->n < f->depth) {
        wh_batch_t b;
        bool d = false;
        if (!wh_loader_next(f->ld, f->n ? 0 : wait_ms, &b, &d, err)) {
            wh_gpu_feed_reset(f);
            return false;
        }
        if (d) {
            f->done = true;
            break;
        }
        if (!b.buf) break;
        bool pad = false;
        const char *flags = (const char *)b.buf->data + wh_batch_host_off(&b, b.pad_off);
        for (uint32_t i = 0; i < b.n; i++) pad |= flags[i] != 0;
        bool refused = false;
        wh_buf_t *dev = wh_gpu_copy_batch(f->g, &b, &refused, err);
        if (refused) wh_loader_stage_all(f->ld);
        wh_buf_unref(b.buf); /* the stage holds it (and its rows' views) until the copy's event */
        if (!dev) {
            wh_gpu_feed_reset(f);
            return wh_err_prefix(err, "batch %llu", (unsigned long long)b.index);
        }
        b.buf = dev;
        uint32_t slot = (f->head + f->n) % f->depth;
        f->q[slot] = b;
        f->pad[slot] = pad;
        f->n++;
    }
    if (!f->n) {
        *done = f->done;
        if (f->done) f->done = false;
        return true;
    }
    *out = f->q[f->head];
    *any_pad = f->pad[f->head];
    f->head = (f->head + 1) % f->depth;
    f->n--;
    return true;
}
