/* libFuzzer: the sample decoder on hostile bytes (a header, descriptors and
 * data as a store would hand them over). A decode that succeeds must give
 * fields inside the buffer; copying and verifying them must stay there. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wh_sample.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static wh_schema_t s;
    static int ready;
    if (!ready) {
        static const char *const names[] = {"id", "data"};
        if (!wh_schema_init(&s, 2, names, NULL)) abort();
        ready = 1;
    }
    /* decode at the place the bytes record, so the checks past it run too */
    uint64_t gen = 0, pos = 0;
    if (size >= 56) {
        memcpy(&gen, data + 40, 8);
        memcpy(&pos, data + 48, 8);
    }
    unsigned char *buf = malloc(size ? size : 1); /* exact size: ASan sees any overrun */
    if (!buf) return 0;
    memcpy(buf, data, size);
    wh_sample_meta_t meta;
    wh_err_t err;
    if (wh_sample_decode_meta(buf, size, &s, gen, (uint32_t)pos, &meta, &err) &&
        meta.total_size <= size) {
        for (int i = 0; i < meta.nfields; i++) {
            if (meta.f[i].offset + meta.f[i].nbytes > size) abort(); /* decode let it out */
            void *out = malloc(meta.f[i].nbytes ? meta.f[i].nbytes : 1);
            if (!out) break;
            wh_sample_verify(&s, &meta, i, buf + meta.f[i].offset, &err);
            wh_sample_copy_field(buf, &s, &meta, i, out, true, &err);
            free(out);
        }
    }
    free(buf);
    return 0;
}
