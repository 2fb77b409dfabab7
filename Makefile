# The README's two commands: `make demo` and `make test`. Each installs the
# missing Debian packages, configures build/ and builds.
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-asan test-tsan test-gpu bench docs clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNCFSM_WERROR=ON $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The flagship demo: real NCCL when GPUs are visible, the sim otherwise.
demo: build
	@scripts/demo.sh $(BUILD)

# Unit, golden, multi-process and fuzz tests, then the same suite under
# ASan+UBSan, then the threaded paths under TSan.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300
	@$(BUILD)/tests/test_legality 2>/dev/null | grep '^legality:'
	$(MAKE) test-asan
	$(MAKE) test-tsan

test-asan: | deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNCFSM_WERROR=ON \
	  -DNCFSM_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 300 -LE 'gpu|fuzz|bench|install|mpi'

test-tsan: | deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNCFSM_WERROR=ON \
	  -DNCFSM_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 300 -L threads

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

bench: build
	$(BUILD)/bench/engine_overhead

docs: build
	cmake --build $(BUILD) --target fsm-docs

# Every build directory configured above.
clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
