/* What every backend's table says and fills alike: its capabilities, the
 * readers of a store status, a generation's params figures. */
#include <stdio.h>
#include <string.h>

#include "wh_backend.h"

unsigned wh_backend_caps(const wh_store_ops_t *ops) {
    unsigned c = ops->flags;
    if (ops->view) c |= WH_CAP_VIEWS;
    if (ops->read_held) c |= WH_CAP_PINS;
    if (ops->view_map && ops->map_unref && ops->map_in_use) c |= WH_CAP_MAPPABLE;
    if (ops->read_encoded) c |= WH_CAP_RELAY_SOURCE;
    if (ops->mirror_begin && ops->mirror_reserve && ops->mirror_commit) c |= WH_CAP_RELAY_TARGET;
    if (ops->spec_claim && ops->spec_renew && ops->spec_fail && ops->spec_put && ops->spec_locate &&
        ops->spec_need && ops->spec_params && ops->spec_status)
        c |= WH_CAP_SPEC;
    return c;
}

void wh_status_add_reader(wh_status_t *o, const wh_reader_beat_t *b, const char *host,
                          uint64_t now_ns) {
    const int cap = (int)WH_ARRAY_LEN(o->readers);
    double age = b->beat_ns <= now_ns ? (double)(now_ns - b->beat_ns) / 1e9 : 0.0;
    if (age > WH_READER_LIVE_S || b->pid <= 0) return;
    double up = b->start_ns && b->start_ns <= now_ns ? (double)(now_ns - b->start_ns) / 1e9 : 0.0;
    int i = 0;
    while (i < o->nreaders && !(o->readers[i].pid == (uint64_t)b->pid &&
                                strncmp(o->readers[i].host, host, sizeof o->readers[i].host) == 0))
        i++;
    if (i == o->nreaders) {
        if (i == cap) return;
        memset(&o->readers[i], 0, sizeof o->readers[i]);
        o->readers[i].pid = (uint64_t)b->pid;
        snprintf(o->readers[i].host, sizeof o->readers[i].host, "%s", host);
        o->readers[i].age_s = age;
        o->nreaders++;
    }
    /* one process's handles (loader threads) add up; the newest generation
     * any of them reads is the one shown, with that generation's reads */
    typeof(o->readers[0]) *r = &o->readers[i];
    r->reads += b->reads;
    if (b->gen > r->generation) {
        r->generation = b->gen;
        r->gen_reads = 0;
    }
    if (b->gen == r->generation) r->gen_reads += b->gen_reads;
    if (up > r->up_s) r->up_s = up;
    if (age < r->age_s) r->age_s = age;
}

void wh_gen_params_add(wh_gen_params_t *out, uint64_t v) {
    if (!out->samples || v < out->min) out->min = v;
    if (!out->samples || v > out->max) {
        out->max = v;
        out->at_max = 0;
    }
    out->at_max += v == out->max;
    out->samples++;
}
