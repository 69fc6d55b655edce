# C tests of the MongoDB store (ext/mongo/*.c) against the in-memory test
# server, plain and ASan+UBSan. The test starts the server itself (jars from
# tests/mongo/fetch.sh) unless WH_MONGO_URI names one.
# Use from the top-level Makefile with `include tests/c/mongo.mk`, or alone:
#   make -f tests/c/mongo.mk ctest-mongo
include ext/sources.mk
MONGO_CC     ?= cc
MONGO_CFLAGS := $(WH_CFLAGS)
MONGO_LIBS   := $(WH_LIBS)
MONGO_SAN    := $(WH_SAN)
MONGO_SRCS   := tests/c/test_mongo.c $(WH_STORE_SRCS)
MONGO_DEPS   := $(MONGO_SRCS) $(WH_HDRS)

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
