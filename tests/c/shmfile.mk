# C tests of the owner-checked shared-memory files (ext/core/wh_shmfile.c).
# Use from the top-level Makefile with `include tests/c/shmfile.mk`, or alone:
#   make -f tests/c/shmfile.mk ctest-shmfile
include ext/sources.mk
SHMFILE_CC     ?= cc
SHMFILE_CFLAGS := $(WH_CFLAGS) -O2
SHMFILE_SAN    := $(WH_SAN)
SHMFILE_SRCS   := tests/c/test_shmfile.c ext/core/wh_shmfile.c ext/core/wh.c
SHMFILE_DEPS   := $(SHMFILE_SRCS) $(WH_HDRS)

.PHONY: ctest-shmfile
ctest-shmfile: build/ctest/test_shmfile build/ctest/test_shmfile_asan
	build/ctest/test_shmfile
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build/ctest/test_shmfile_asan

build/ctest/test_shmfile: $(SHMFILE_DEPS)
	@mkdir -p $(@D)
	$(SHMFILE_CC) $(SHMFILE_CFLAGS) -o $@ $(SHMFILE_SRCS)

build/ctest/test_shmfile_asan: $(SHMFILE_DEPS)
	@mkdir -p $(@D)
	$(SHMFILE_CC) $(SHMFILE_CFLAGS) -O1 $(SHMFILE_SAN) -o $@ $(SHMFILE_SRCS)
