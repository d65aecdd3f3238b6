# Front end for CMake. `make demo` and `make test` are the two commands in the README.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
BENCH_BUILD ?= build-bench
PREFIX ?= /usr/local

.PHONY: all deps build build-asan build-tsan fuzz-build test demo install fuzz bench clean format

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRK_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# The unit tests under ThreadSanitizer (the checkpoint writer, the hash thread and the exporter's
# collector are threads). OpenMP and OpenBLAS are not instrumented: one thread each there.
build-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRK_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)

# Every test: unit + integration in the release build, unit tests again under ASan+UBSan and
# under ThreadSanitizer, and a short run of every fuzz target.
test: build build-asan build-tsan fuzz-build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ctest --output-on-failure -j $(JOBS) -L unit
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) -L unit
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) -L fuzz

fuzz-build: deps
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRK_FUZZ=ON -DRK_SANITIZE=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)

# Longer fuzzing session: make fuzz FUZZ_SECONDS=300
FUZZ_SECONDS ?= 60
fuzz: fuzz-build
	@for f in $(FUZZ_BUILD)/fuzz/fuzz_*; do \
	  [ -x "$$f" ] || continue; n=$$(basename $$f); mkdir -p $(FUZZ_BUILD)/fuzz/runs/$$n; \
	  echo "== $$n ($(FUZZ_SECONDS)s)"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) $(FUZZ_BUILD)/fuzz/runs/$$n fuzz/corpus/$$n || exit 1; \
	done

# The main job: rk run keeps 4 ranks of cnn-small training through injected faults
# (scripts/demo.sh says which) and prints what happened and the test accuracy.
demo: build
	scripts/demo.sh $(BUILD)

install: build
	cmake --install $(BUILD)

bench: deps
	@scripts/install-deps.sh --bench
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DRK_BENCH=ON >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS)
	bench/train_throughput $(BENCH_BUILD)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(BENCH_BUILD)
