# Larder: `make run` and `make test` do all the set-up on a fresh Debian 12 machine.
BUILD_DIR ?= build
TEST_BUILD_DIR ?= build-check
JOBS ?= 2
# ctest's parallelism: most tests wait on processes, sockets and deadlines rather than compute,
# so twice the cores finishes the suite in 57% of the time of -j$(JOBS) on 2 cores (docs/testing.md).
CTEST_JOBS ?= 4
PREFIX ?= /usr/local
# `make fuzz` runs each fuzz target for FUZZ_RUNS inputs, or FUZZ_SECONDS if that comes first;
# `make test` runs each for TEST_FUZZ_SECONDS (the tests fuzz_<target>_run).
FUZZ_RUNS ?= 10000000
FUZZ_SECONDS ?= 3600
TEST_FUZZ_SECONDS ?= 20
# Optimisation of the checked build: -O1 with line tables only compiles in half the time of
# -O2 -g, and ASan's reports and libFuzzer's coverage need no more.
CHECK_OPT_FLAGS ?= -O1 -g1 -DNDEBUG
# Each step of `make run` and `make test` appends "<phase> <seconds>" to this file when it is set
# (.ci/run prints them as a table).
export LARDER_PHASE_LOG
TIMED = scripts/timed.sh

.PHONY: all deps build run test check-build thread-safety bench fuzz deb install format format-check clean help

all: build

help:
	@echo "make run          install deps, build (Release), run the store demo (master + 3 processes)"
	@echo "make test         install deps, build the checked tree in $(TEST_BUILD_DIR)/ (clang: ASan, UBSan,"
	@echo "                  lock annotations, libFuzzer), run every test (ctest, fuzz targets included)"
	@echo "make thread-safety  build the checked tree: clang's -Wthread-safety over every source, as errors"
	@echo "make fuzz         build the checked tree, run each fuzz target for FUZZ_RUNS ($(FUZZ_RUNS)) inputs or FUZZ_SECONDS ($(FUZZ_SECONDS))"
	@echo "make bench        build, run the benchmarks into bench/results/"
	@echo "make build        Release build into $(BUILD_DIR)/ (binaries in $(BUILD_DIR)/bin)"
	@echo "make deb          Debian packages (liblarder, larder-tools, python3-larder) into $(BUILD_DIR)/packages/"
	@echo "make install      build and install under PREFIX ($(PREFIX))"
	@echo "make format       clang-format every source file"

deps:
	@$(TIMED) deps scripts/install-deps.sh

build: deps
	@$(TIMED) "release build" sh -c 'cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release \
	  -DLARDER_BUILD_TESTS=OFF && cmake --build $(BUILD_DIR) -j$(JOBS)'

run: build
	@$(TIMED) demo env LARDER_LOG_LEVEL=$${LARDER_LOG_LEVEL:-warn} $(BUILD_DIR)/bin/larder-demo

# The checked build: clang with AddressSanitizer, UndefinedBehaviorSanitizer, -Wthread-safety
# (every lock annotation checked as each file compiles) and libFuzzer's coverage, so that the
# fuzz targets are built in the same tree as the tests. gcc sees every file in `make build`.
check-build: deps
	@$(TIMED) "checked build" sh -c 'cmake -S . -B $(TEST_BUILD_DIR) \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DLARDER_SANITIZE=ON -DLARDER_FUZZ=ON -DCMAKE_INSTALL_PREFIX=/usr \
	  -DLARDER_TEST_FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(CHECK_OPT_FLAGS)" && cmake --build $(TEST_BUILD_DIR) -j$(JOBS)'

test: check-build
	@$(TIMED) ctest sh -c 'cd $(TEST_BUILD_DIR) && ctest --output-on-failure -j$(CTEST_JOBS)'

thread-safety: check-build

fuzz: check-build
	scripts/fuzz.sh $(TEST_BUILD_DIR) $(FUZZ_SECONDS) $(FUZZ_RUNS)

# The packages install under /usr (settings in /etc/default, units in /usr/lib/systemd/system).
deb: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DLARDER_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/usr
	cmake --build $(BUILD_DIR) -j$(JOBS)
	cd $(BUILD_DIR) && cpack -G DEB
	@ls -1 $(BUILD_DIR)/packages/*.deb

install: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DLARDER_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=$(PREFIX)
	cmake --build $(BUILD_DIR) -j$(JOBS)
	cmake --install $(BUILD_DIR)

bench: build
	scripts/bench.sh $(BUILD_DIR)

SOURCES = $(shell find include src tools tests fuzz python/ext -name '*.cc' -o -name '*.h')

format:
	clang-format -i $(SOURCES)

format-check:
	clang-format --dry-run --Werror $(SOURCES)

clean:
	rm -rf $(BUILD_DIR) $(TEST_BUILD_DIR)
