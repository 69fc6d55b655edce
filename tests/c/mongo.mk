# C tests of the MongoDB store (ext/wh_mongo*.c) against the in-memory test
# server, plain and ASan+UBSan. The test starts the server itself (jars from
# tests/mongo/fetch.sh) unless WH_MONGO_URI names one.
# Use from the top-level Makefile with `include tests/c/mongo.mk`, or alone:
#   make -f tests/c/mongo.mk ctest-mongo
MONGO_CC     ?= cc
MONGO_PKGS   := libmongoc-1.0 libbson-1.0 libxxhash
MONGO_CFLAGS := -std=gnu11 -Wall -Wextra -Werror -g -Iext $(shell pkg-config --cflags $(MONGO_PKGS) 2>/dev/null)
MONGO_LIBS   := $(shell pkg-config --libs $(MONGO_PKGS) 2>/dev/null) -lpthread -lrt
MONGO_SAN    := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
MONGO_SRCS   := tests/c/test_mongo.c ext/wh.c ext/wh_fault.c ext/wh_sample.c ext/wh_store.c ext/wh_shm.c $(sort $(wildcard ext/wh_mongo*.c))
MONGO_DEPS   := $(MONGO_SRCS) $(wildcard ext/*.h)

.PHONY: ctest-mongo
ctest-mongo: build/ctest/test_mongo build/ctest/test_mongo_asan
	sh tests/mongo/fetch.sh
	build/ctest/test_mongo
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build/ctest/test_mongo_asan

build/ctest/test_mongo: $(MONGO_DEPS)
	@mkdir -p $(@D)
	$(MONGO_CC) $(MONGO_CFLAGS) -O2 -o $@ $(MONGO_SRCS) $(MONGO_LIBS)

build/ctest/test_mongo_asan: $(MONGO_DEPS)
	@mkdir -p $(@D)
	$(MONGO_CC) $(MONGO_CFLAGS) -O1 $(MONGO_SAN) -o $@ $(MONGO_SRCS) $(MONGO_LIBS)
