# Benchmarks. From the top-level Makefile (`include benchmarks/bench.mk`),
# or alone: make -f benchmarks/bench.mk bench-store
#   bench-store   shm store read/write throughput vs memcpy, seal time vs
#                 SWAP_CAP (benchmarks/bench_store.c); BENCH_STORE_ARGS=--quick
#                 for a short run
include ext/sources.mk
BENCH_CC          ?= cc
BENCH_STORE_SRCS  := benchmarks/bench_store.c $(WH_STORE_SRCS)
BENCH_STORE_ARGS  ?=

.PHONY: bench-store

build/bench/bench_store: $(BENCH_STORE_SRCS) $(WH_HDRS)
	@mkdir -p $(@D)
	$(BENCH_CC) $(WH_CFLAGS) -O2 -o $@ $(BENCH_STORE_SRCS) $(WH_LIBS)

build/bench/bench_mongo: benchmarks/bench_mongo.c $(WH_STORE_SRCS) $(WH_HDRS)
	@mkdir -p $(@D)
	$(BENCH_CC) $(WH_CFLAGS) -O2 -o $@ benchmarks/bench_mongo.c $(WH_STORE_SRCS) $(WH_LIBS)

bench-store: build/bench/bench_store
	build/bench/bench_store $(BENCH_STORE_ARGS)
