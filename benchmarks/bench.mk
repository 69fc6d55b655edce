# Benchmarks. From the top-level Makefile (`include benchmarks/bench.mk`),
# or alone: make -f benchmarks/bench.mk bench-store
#   bench-store   shm store read/write throughput vs memcpy, seal time vs
#                 SWAP_CAP (benchmarks/bench_store.c); BENCH_STORE_ARGS=--quick
#                 for a short run
BENCH_CC          ?= cc
BENCH_CFLAGS      := -std=gnu11 -Wall -Wextra -Werror -O2 -g -Iext
BENCH_PKGS        := libmongoc-1.0 libxxhash
BENCH_STORE_SRCS  := benchmarks/bench_store.c ext/wh.c ext/wh_fault.c ext/wh_sample.c ext/wh_shm.c \
                     ext/wh_store.c $(sort $(wildcard ext/wh_mongo*.c))
BENCH_STORE_ARGS  ?=

.PHONY: bench-store

build/bench/bench_store: $(BENCH_STORE_SRCS) $(wildcard ext/*.h)
	@mkdir -p $(@D)
	$(BENCH_CC) $(BENCH_CFLAGS) $(shell pkg-config --cflags $(BENCH_PKGS)) -o $@ \
	  $(BENCH_STORE_SRCS) $(shell pkg-config --libs $(BENCH_PKGS)) -lpthread -lrt

bench-store: build/bench/bench_store
	build/bench/bench_store $(BENCH_STORE_ARGS)
