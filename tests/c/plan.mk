# C property tests for the sample order (ext/core/wh_plan.c).
# Use from the top-level Makefile with `include tests/c/plan.mk`, or alone:
#   make -f tests/c/plan.mk ctest-plan
include ext/sources.mk
PLAN_CC     ?= cc
PLAN_CFLAGS := $(WH_CFLAGS) -O2
PLAN_SAN    := $(WH_SAN)
PLAN_SRCS   := tests/c/test_plan.c $(WH_PLAN_SRCS)
PLAN_DEPS   := $(PLAN_SRCS) $(WH_HDRS)

.PHONY: ctest-plan
ctest-plan: build/ctest/test_plan build/ctest/test_plan_asan
	build/ctest/test_plan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build/ctest/test_plan_asan

build/ctest/test_plan: $(PLAN_DEPS)
	@mkdir -p $(@D)
	$(PLAN_CC) $(PLAN_CFLAGS) -o $@ $(PLAN_SRCS) -lm

build/ctest/test_plan_asan: $(PLAN_DEPS)
	@mkdir -p $(@D)
	$(PLAN_CC) $(PLAN_CFLAGS) -O1 $(PLAN_SAN) -o $@ $(PLAN_SRCS) -lm
