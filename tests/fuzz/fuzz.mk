# libFuzzer harnesses (clang, ASan+UBSan) over the decoders hostile bytes
# reach: samples, shm segments, MongoDB documents. `make fuzz` runs each for
# FUZZ_SECONDS; `make test` runs them briefly. Seeds: tests/fuzz/corpus/NAME;
# what a run finds grows build/fuzz/corpus/NAME; a crash fails the target
# and leaves its input (crash-*) in build/fuzz/NAME.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := fuzz_sample fuzz_segment fuzz_mongo_docs
FUZZ_CFLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
              -Iext $(shell pkg-config --cflags libmongoc-1.0 libxxhash 2>/dev/null)
FUZZ_LIBS = $(STORE_LIBS)
FUZZ_EXT := ext/util.c ext/wh_fault.c ext/wh_sample.c ext/wh_shm.c ext/wh_store.c

build/fuzz/fuzz_sample: tests/fuzz/fuzz_sample.c $(FUZZ_EXT) $(wildcard ext/*.h)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_EXT) ext/wh_mongo.c $(FUZZ_LIBS)
build/fuzz/fuzz_segment: tests/fuzz/fuzz_segment.c $(FUZZ_EXT) $(wildcard ext/*.h)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_EXT) ext/wh_mongo.c $(FUZZ_LIBS)
# includes ext/wh_mongo.c itself, for its static parsers
build/fuzz/fuzz_mongo_docs: tests/fuzz/fuzz_mongo_docs.c ext/wh_mongo.c $(FUZZ_EXT) $(wildcard ext/*.h)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_EXT) $(FUZZ_LIBS)

fuzz: .deps/debian.stamp $(addprefix build/fuzz/,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/corpus/$$t && \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s" && \
	  (cd build/fuzz && ASAN_OPTIONS=detect_leaks=1 ./$$t -max_total_time=$(FUZZ_SECONDS) \
	     -max_len=4096 -timeout=10 -print_final_stats=1 \
	     corpus/$$t $(CURDIR)/tests/fuzz/corpus/$$t 2>&1 | tail -12) && \
	  test -z "$$(ls build/fuzz/crash-* build/fuzz/leak-* build/fuzz/timeout-* 2>/dev/null)" || \
	  { echo "fuzz: $$t found a failure: $$(ls build/fuzz/crash-* build/fuzz/leak-* build/fuzz/timeout-* 2>/dev/null)"; exit 1; }; \
	done

test-fuzz:
	$(MAKE) fuzz FUZZ_SECONDS=15

.PHONY: fuzz test-fuzz
