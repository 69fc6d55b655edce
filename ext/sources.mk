# The C sources and flags, listed once for every C target (the Python
# extension itself takes ext/*/*.c through setup.py). Included by the
# top-level Makefile and by each tests/ and benchmarks/ .mk file.
# One folder per layer (ext/*/README.md); files include each other by
# name, so every folder is on the include path.
WH_PKGS    := libmongoc-1.0 libbson-1.0 libxxhash
WH_INC     := -Iext $(addprefix -I,$(patsubst %/,%,$(sort $(dir $(wildcard ext/*/*.[ch])))))
# test builds: the fault-injection points compiled in (ext/core/wh_fault.h)
WH_CFLAGS  := -std=gnu11 -Wall -Wextra -Werror -g $(WH_INC) -DWH_FAULTS \
              $(shell pkg-config --cflags $(WH_PKGS) 2>/dev/null)
WH_LIBS    := $(shell pkg-config --libs $(WH_PKGS) 2>/dev/null) -lpthread -lrt
WH_SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
WH_HDRS    := $(wildcard ext/*/*.h)
# the sample order: pure arithmetic over wh.c
WH_PLAN_SRCS  := ext/core/wh.c ext/core/wh_plan.c
# the store (both backends) and what it stands on (the batch fill and the
# workers' ring, wh_batch.c and wh_ring.c, included): every ext/ file but the
# Python glue, the readers built on the store, and the CUDA stage
WH_NOT_STORE  := $(wildcard ext/py/*.c ext/cuda/*.c) ext/read/wh_loader.c ext/core/wh_plan.c
WH_STORE_SRCS := $(sort $(filter-out $(WH_NOT_STORE),$(wildcard ext/*/*.c)))
WH_MONGO_SRCS := $(sort $(wildcard ext/mongo/*.c))
