# Larder: `make run` and `make test` do all the set-up on a fresh Debian 12 machine.
BUILD_DIR ?= build
TEST_BUILD_DIR ?= build-asan
FUZZ_BUILD_DIR ?= build-fuzz
JOBS ?= 2
PREFIX ?= /usr/local
# `make fuzz` runs each fuzz target for FUZZ_RUNS inputs, or FUZZ_SECONDS if that comes first;
# `make test` runs each for TEST_FUZZ_SECONDS.
FUZZ_RUNS ?= 10000000
FUZZ_SECONDS ?= 3600
TEST_FUZZ_SECONDS ?= 20
# Optimisation of the sanitizer and fuzz builds: -O1 with line tables only compiles in half the
# time of -O2 -g, and ASan's reports and libFuzzer's coverage need no more.
CHECK_OPT_FLAGS ?= -O1 -g1 -DNDEBUG

.PHONY: all deps build run test thread-safety bench fuzz fuzz-build deb install format format-check clean help

all: build

help:
	@echo "make run          install deps, build (Release), run the store demo (master + 3 processes)"
	@echo "make test         install deps, build with ASan+UBSan in $(TEST_BUILD_DIR)/, run every test (ctest)"
	@echo "make thread-safety  check the lock annotations with clang -Wthread-safety over $(TEST_BUILD_DIR)/'s sources"
	@echo "make bench        build, run the benchmarks into bench/results/"
	@echo "make fuzz         build the libFuzzer targets with clang in $(FUZZ_BUILD_DIR)/, run each for FUZZ_RUNS ($(FUZZ_RUNS)) inputs or FUZZ_SECONDS ($(FUZZ_SECONDS))"
	@echo "make build        Release build into $(BUILD_DIR)/ (binaries in $(BUILD_DIR)/bin)"
	@echo "make deb          Debian packages (liblarder, larder-tools, python3-larder) into $(BUILD_DIR)/packages/"
	@echo "make install      build and install under PREFIX ($(PREFIX))"
	@echo "make format       clang-format every source file"

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DLARDER_BUILD_TESTS=OFF
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	LARDER_LOG_LEVEL=$${LARDER_LOG_LEVEL:-warn} $(BUILD_DIR)/bin/larder-demo

test: deps
	cmake -S . -B $(TEST_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLARDER_SANITIZE=ON \
	  -DCMAKE_INSTALL_PREFIX=/usr \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(CHECK_OPT_FLAGS)"
	cmake --build $(TEST_BUILD_DIR) -j$(JOBS)
	JOBS=$(JOBS) scripts/thread_safety.sh $(TEST_BUILD_DIR)
	cd $(TEST_BUILD_DIR) && ctest --output-on-failure -j$(JOBS)
	$(MAKE) fuzz-build
	scripts/fuzz.sh $(FUZZ_BUILD_DIR) $(TEST_FUZZ_SECONDS)

# clang's lock analysis over every source the test build compiles (its compile_commands.json).
thread-safety: deps
	cmake -S . -B $(TEST_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLARDER_SANITIZE=ON \
	  -DCMAKE_INSTALL_PREFIX=/usr \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(CHECK_OPT_FLAGS)"
	cmake --build $(TEST_BUILD_DIR) -j$(JOBS) --target larder_proto
	JOBS=$(JOBS) scripts/thread_safety.sh $(TEST_BUILD_DIR)

fuzz-build: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(CHECK_OPT_FLAGS)" \
	  -DLARDER_FUZZ=ON -DLARDER_BUILD_TESTS=OFF -DLARDER_BUILD_PYTHON=OFF
	cmake --build $(FUZZ_BUILD_DIR) -j$(JOBS) --target larder-fuzzers

fuzz: fuzz-build
	scripts/fuzz.sh $(FUZZ_BUILD_DIR) $(FUZZ_SECONDS) $(FUZZ_RUNS)

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

SOURCES = $(shell find include src tools tests fuzz -name '*.cc' -o -name '*.h')

format:
	clang-format -i $(SOURCES)

format-check:
	clang-format --dry-run --Werror $(SOURCES)

clean:
	rm -rf $(BUILD_DIR) $(TEST_BUILD_DIR) $(FUZZ_BUILD_DIR)
