# Thin driver over CMake (as Neovim's Makefile is): the real build is CMakeLists.txt.
#   make            build (installs missing Debian packages first)
#   make check      every test: normal build, ASan+UBSan, TSan, and the verbs suite in the Soft-RoCE VM
#   make demo       build and run the demo on the best transport this machine has
#   make bench      build and run the benchmarks
#   make fuzz       build build-fuzz/ (clang, VRPC_FUZZ=ON) and run every fuzzer of tests/fuzz for
#                   FUZZ_SECONDS (default 600) each, from its seeds and the corpus kept so far:
#                   new corpus entries stay in FUZZ_CORPUS/NAME (default build-fuzz/corpus/NAME,
#                   outside the source tree), crash inputs in build-fuzz/artifacts/NAME/ with the
#                   command to replay them; FUZZERS="fuzz_wire fuzz_pb" runs only those
#                   (tests/fuzz/README.md)
#   make install    install into PREFIX (default /usr/local)
#   make soak       bounded soak under injected faults (SOAK_SECONDS, default 300): server RSS/fds flat
BUILD    ?= build
JOBS     ?= $(shell nproc)
PREFIX   ?= /usr/local
WERROR   ?= OFF
CMAKE_ARGS ?=
FUZZ_SECONDS ?= 600
FUZZ_CORPUS  ?= build-fuzz/corpus
FUZZERS      ?=

.PHONY: all deps configure build check demo bench fuzz soak install clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DVRPC_WERROR=$(WERROR) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

check: deps
	@WERROR=$(WERROR) JOBS=$(JOBS) scripts/check.sh

demo: configure
	@echo "demo: building (log in $(BUILD)/build.log)"
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory >$(BUILD)/build.log 2>&1 || { tail -40 $(BUILD)/build.log; exit 1; }
	@scripts/demo.sh $(BUILD)

bench: build
	@scripts/bench.sh $(BUILD)

fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DVRPC_FUZZ=ON -DVRPC_BUILD_TESTS=OFF -DVRPC_BUILD_BENCH=OFF \
		-DVRPC_BUILD_EXAMPLES=OFF -DVRPC_WERROR=$(WERROR) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzzers -- --no-print-directory
	@tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_CORPUS) $(FUZZERS)

soak: build
	@scripts/soak.sh $(BUILD)

install: build
	@cmake --install $(BUILD)

clean:
	rm -rf build build-asan build-tsan build-fuzz
