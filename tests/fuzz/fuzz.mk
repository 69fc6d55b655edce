# libFuzzer harnesses (clang, ASan+UBSan) over the decoders hostile bytes
# reach: samples, shm segments, MongoDB documents. `make fuzz` runs each for
# FUZZ_SECONDS; `make test` runs them briefly. Seeds: tests/fuzz/corpus/NAME;
# what a run finds grows build/fuzz/corpus/NAME; a crash fails the target
# and leaves its input (crash-*) in build/fuzz/NAME.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := fuzz_sample fuzz_segment fuzz_mongo_docs
include ext/sources.mk
FUZZ_CFLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
              $(WH_INC) $(shell pkg-config --cflags $(WH_PKGS) 2>/dev/null)

build/fuzz/fuzz_sample: tests/fuzz/fuzz_sample.c $(WH_STORE_SRCS) $(WH_HDRS)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(WH_STORE_SRCS) $(WH_LIBS)
build/fuzz/fuzz_segment: tests/fuzz/fuzz_segment.c $(WH_STORE_SRCS) $(WH_HDRS)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(WH_STORE_SRCS) $(WH_LIBS)
# includes the files holding the static parsers, links the rest
FUZZ_MONGO_OWN := ext/mongo/wh_mongo_state.c ext/mongo/wh_mongo_lease.c ext/mongo/wh_mongo_read.c
build/fuzz/fuzz_mongo_docs: tests/fuzz/fuzz_mongo_docs.c $(WH_STORE_SRCS) $(WH_HDRS)
	@mkdir -p $(@D)
	clang $(FUZZ_CFLAGS) -o $@ $< $(filter-out $(FUZZ_MONGO_OWN),$(WH_STORE_SRCS)) $(WH_LIBS)

fuzz: .deps/debian-test.stamp $(addprefix build/fuzz/,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build/fuzz/corpus/$$t && \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s" && \
	  (cd build/fuzz && ASAN_OPTIONS=detect_leaks=1 ./$$t -max_total_time=$(FUZZ_SECONDS) \
	     -max_len=4096 -timeout=10 -print_final_stats=1 \
	     corpus/$$t $(CURDIR)/tests/fuzz/corpus/$$t 2>&1 | tail -12) && \
	  bad="$$(ls build/fuzz/crash-* build/fuzz/leak-* build/fuzz/timeout-* build/fuzz/oom-* 2>/dev/null)"; \
	  test -z "$$bad" || { echo "fuzz: $$t found a failure: $$bad"; \
	    (cd build/fuzz && ./$$t $$(basename $$(echo "$$bad" | head -1)) 2>&1 | grep -v '^INFO' | head -40); \
	    exit 1; }; \
	done

test-fuzz:
	$(MAKE) fuzz FUZZ_SECONDS=15

.PHONY: fuzz test-fuzz
