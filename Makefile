# Front end for CMake. `make demo` and `make test` are the two commands in the README.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
BENCH_BUILD ?= build-bench
PKG_BUILD ?= build-pkg
PREFIX ?= /usr/local
# AUTO: the tests are built when cmocka (a test package) is installed; make test sets ON
RK_TESTS ?= AUTO

.PHONY: all deps deps-run deps-test build build-asan build-tsan fuzz-build test demo install package fuzz \
	bench bench-pytorch clean format format-check

all: build

# scripts/install-deps.sh checks its package groups with dpkg and needs root only to install
# a missing one: what builds (make build), what runs the demo, what the tests use.
deps:
	@scripts/install-deps.sh build
deps-run:
	@scripts/install-deps.sh build run
deps-test:
	@scripts/install-deps.sh build run test

# Quiet: progress only, the full output in $(BUILD)/build.log, shown when a step fails
# (scripts/quiet-build.sh); make build V=1 prints all of it.
build: deps
	@JOBS=$(JOBS) scripts/quiet-build.sh $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
	  -DRK_TESTS=$(RK_TESTS)

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRK_SANITIZE=ON -DRK_TESTS=$(RK_TESTS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# The unit tests under ThreadSanitizer (the checkpoint writer, the hash thread and the exporter's
# collector are threads). OpenMP and OpenBLAS are not instrumented: one thread each there.
build-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DRK_TSAN=ON -DRK_TESTS=$(RK_TESTS) >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)

# Every test: the sources' formatting first, then unit + integration in the release build,
# unit tests again under ASan+UBSan and under ThreadSanitizer, and a short run of every fuzz
# target.
# RK_TESTS=ON here reaches every build this target makes (a target's variables hold for its
# prerequisites): without cmocka they fail to configure rather than build no tests.
test: RK_TESTS = ON
test: format-check build build-asan build-tsan fuzz-build package
	cd $(BUILD) && RK_PKG_DIR=$(CURDIR)/$(PKG_BUILD)/packages ctest --output-on-failure -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ctest --output-on-failure -j $(JOBS) -L unit
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) -L unit
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) -L fuzz

fuzz-build: deps-test
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
demo: deps-run build
	@scripts/demo.sh $(BUILD)

# rk, librekindle, headers, the Python package, the man page and the docs under PREFIX; not
# the systemd units nor /etc/rekindle (cmake --install $(BUILD) --component rekindle adds
# them; docs/packaging.md). Needs only the build group of scripts/install-deps.sh.
install: build
	cmake --install $(BUILD)

# The Debian packages rekindle, librekindle0 and rekindle-dev (docs/packaging.md), built in a
# tree of their own for /usr with Debian's hardening flags, by CPack's DEB generator, into
# $(PKG_BUILD)/packages/. Install them with: apt install ./$(PKG_BUILD)/packages/*.deb
PKG_CFLAGS = $(shell dpkg-buildflags --get CFLAGS) $(shell dpkg-buildflags --get CPPFLAGS)
PKG_LDFLAGS = $(shell dpkg-buildflags --get LDFLAGS)
package: deps
	@rm -rf $(PKG_BUILD)/packages
	@JOBS=$(JOBS) RK_TARGETS="rk rekindle rkloopback rk_package_files" scripts/quiet-build.sh $(PKG_BUILD) \
	  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
	  -DRK_PYTHON_INSTALL_DIR=lib/python3/dist-packages -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON \
	  "-DCMAKE_C_FLAGS=$(PKG_CFLAGS)" "-DCMAKE_EXE_LINKER_FLAGS=$(PKG_LDFLAGS)" \
	  "-DCMAKE_SHARED_LINKER_FLAGS=$(PKG_LDFLAGS)" "-DCMAKE_MODULE_LINKER_FLAGS=$(PKG_LDFLAGS)"
	@cd $(PKG_BUILD) && cpack -G DEB >cpack.log 2>&1 || { cat cpack.log >&2; echo "package: cpack failed; log: $(PKG_BUILD)/cpack.log" >&2; exit 1; }
	@ls $(PKG_BUILD)/packages/*.deb | sed 's/^/package: /'

bench: deps
	@scripts/install-deps.sh build run test bench
	@cmake -S . -B $(BENCH_BUILD) -DCMAKE_BUILD_TYPE=Release -DRK_BENCH=ON >/dev/null
	@cmake --build $(BENCH_BUILD) -j $(JOBS)
	bench/train_throughput $(BENCH_BUILD)

# torchrun against rk run on examples/pytorch (bench/RESULTS.md, PyTorch); needs python3-torch
bench-pytorch: build
	bench/pytorch_vs_torchrun.py $(BUILD)

# The C sources and headers that follow the repo's .clang-format: every file tracked by git
# under these directories. `make format-check` fails, naming each file that differs (one
# place in each), when one does; `make format` rewrites them all in place. Debian 12's
# clang-format is version 14; another version may format a few constructs differently.
FORMAT_DIRS = src cli include tests fuzz bench examples
CLANG_FORMAT ?= clang-format
format_files = files=$$(git ls-files -- $(foreach d,$(FORMAT_DIRS),'$(d)/*.c' '$(d)/*.h')) && \
	[ -n "$$files" ] || { echo "format: no tracked C files (not a git checkout?)" >&2; exit 1; }

format-check: deps-test
	@$(format_files); \
	if out=$$($(CLANG_FORMAT) --dry-run -Werror $$files 2>&1); then \
	  echo "format-check: $$(echo $$files | wc -w) files follow .clang-format"; \
	else \
	  printf '%s\n' "$$out" | grep -E '^[^ :]+:[0-9]+:[0-9]+: (error|warning)' | \
	    awk -F: '!seen[$$1]++ {n++; print} END {printf "format-check: %d files differ from .clang-format (the first place in each above): make format rewrites them\n", n}' >&2; \
	  exit 1; \
	fi

format:
	@$(format_files); $(CLANG_FORMAT) -i $$files

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(BENCH_BUILD) $(PKG_BUILD)
