# Larder: `make run` and `make test` do all the set-up on a fresh Debian 12 machine.
BUILD_DIR ?= build
TEST_BUILD_DIR ?= build-asan
JOBS ?= 2

.PHONY: all deps build run test bench format format-check clean help

all: build

help:
	@echo "make run          install deps, build (Release), run the store demo (master + 3 processes)"
	@echo "make test         install deps, build with ASan+UBSan in $(TEST_BUILD_DIR)/, run every test (ctest)"
	@echo "make bench        build, run the benchmarks into bench/results/"
	@echo "make build        Release build into $(BUILD_DIR)/ (binaries in $(BUILD_DIR)/bin)"
	@echo "make format       clang-format every source file"

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DLARDER_BUILD_TESTS=OFF
	cmake --build $(BUILD_DIR) -j$(JOBS)

run: build
	LARDER_LOG_LEVEL=$${LARDER_LOG_LEVEL:-warn} $(BUILD_DIR)/bin/larder-demo

test: deps
	cmake -S . -B $(TEST_BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLARDER_SANITIZE=ON
	cmake --build $(TEST_BUILD_DIR) -j$(JOBS)
	cd $(TEST_BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

bench: build
	scripts/bench.sh $(BUILD_DIR)

SOURCES = $(shell find include src tools tests -name '*.cc' -o -name '*.h')

format:
	clang-format -i $(SOURCES)

format-check:
	clang-format --dry-run --Werror $(SOURCES)

clean:
	rm -rf $(BUILD_DIR) $(TEST_BUILD_DIR)
