/* libFuzzer: MongoDB documents a tampered database could hold, through the
 * pure parsers the store uses (state and its spec part, schema, lease,
 * manifest, chunk). The first byte picks the parser; the rest is the BSON
 * document. */
#include "../../ext/mongo/wh_mongo_state.c"
#include "../../ext/mongo/wh_mongo_lease.c"
#include "../../ext/mongo/wh_mongo_read.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static wh__mongo_t m;
    static int ready;
    if (!ready) {
        static const char *const names[] = {"id", "data"};
        if (!wh_schema_init(&m.base.cfg.schema, 2, names, NULL)) abort();
        m.base.cfg.swap_cap = 8;
        snprintf(m.prefix, sizeof m.prefix, "wirehead");
        snprintf(m.where, sizeof m.where, "mongodb://fuzz/db");
        ready = 1;
    }
    if (size < 1) return 0;
    bson_t doc;
    if (!bson_init_static(&doc, data + 1, size - 1)) return 0;
    wh_err_t err;
    switch (data[0] % 5) {
    case 0: {
        wh__state_t s;
        wh__parse_state(&doc, &s);
        if (s.nhist < 0 || s.nhist > WH__HIST) abort();
        /* spec mode's part of it (wh_mongo_spec_doc.c) */
        wh__spec_check(&m, &doc, &err);
        if (wh__spec_parse(&m, &doc, &s.spec, &err) &&
            (s.spec.nkept < 0 || s.spec.nkept > WH__SPEC_KEPT || s.spec.nfails < 0 ||
             s.spec.nfails > WH__SPEC_FAILS))
            abort();
        break;
    }
    case 1: wh__check_schema(&m, &doc, &err); break;
    case 2: wh__lease_forged(&doc, 1000000); break;
    default: {
        wh__manifest_t mf;
        wh_sample_meta_t meta;
        if (!wh__parse_manifest(&doc, &m.base.cfg.schema, 7, 1, &mf, &meta, &err)) {
            /* a fixed sample, so chunk documents are checked on their own */
            mf = (wh__manifest_t){.sid = 5, .cb = 64, .nchunks = 4, .dlen = 200};
        }
        if (data[0] % 5 == 4 && mf.nchunks <= WH__MAX_CHUNKS) {
            unsigned char *seen = calloc(mf.nchunks ? mf.nchunks : 1, 1);
            int64_t dc;
            const uint8_t *bytes;
            uint32_t blen;
            if (seen && wh__parse_chunk(&doc, &mf, seen, 7, 1, &dc, &bytes, &blen, &err) &&
                ((uint64_t)dc >= mf.nchunks || blen > mf.cb))
                abort(); /* accepted a chunk outside the sample */
            free(seen);
        }
        break;
    }
    }
    return 0;
}
