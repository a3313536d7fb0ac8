# memsnap: the two set-up commands are `make demo` and `make test` (see README.md).
# Each installs what is missing, configures and builds into build/, then runs.
#   make test SANITIZE=1   the whole suite built with -fsanitize=address,undefined (build-asan/)
#   make test TSAN=1       the whole suite built with -fsanitize=thread (build-tsan/)
#   make test TESTS=REGEX  only the ctest entries matching REGEX (e.g. TESTS='^(stress|history)$')
#   make bench             benchmarks in a profile-guided Release tree; writes build/bench/results.json
#   make fuzz FUZZ_SECONDS=60 [FUZZ_TARGETS="fuzz_load ..."]   libFuzzer targets (clang), seeded
#                               with tests/fuzz/corpus/ (and the fixtures for the readers)
#   make wheel             dist/memsnap-*.whl: pip install it anywhere (docs/python.md)
#   make check             the module rule on #include lines (also a test of make test)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE ?= cmake
ifeq ($(SANITIZE),1)
BUILD ?= build-asan
EXTRA_CMAKE += -DMS_SANITIZE=ON
else ifeq ($(TSAN),1)
BUILD ?= build-tsan
EXTRA_CMAKE += -DMS_TSAN=ON
else
BUILD ?= build
endif
MS_DEBUG ?= 3
FUZZ_SECONDS ?= 60

.PHONY: all deps test-deps build demo demo-build test check bench fuzz wheel clean

all: build

deps:
	@scripts/deps.sh build

test-deps:
	@scripts/deps.sh test

$(BUILD)/CMakeCache.txt:
	$(CMAKE) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMS_DEBUG=$(MS_DEBUG) $(EXTRA_CMAKE)

build: deps $(BUILD)/CMakeCache.txt
	$(CMAKE) --build $(BUILD) -j $(JOBS)

# The demo's build is quiet: its output goes to $(BUILD)/build.log, shown only when it fails.
demo: deps
	@mkdir -p $(BUILD)
	@printf 'memsnap demo: building into %s/ (log: %s/build.log)\n' '$(BUILD)' '$(BUILD)'
	@$(MAKE) --no-print-directory demo-build >$(BUILD)/build.log 2>&1 || \
	  { tail -n 30 $(BUILD)/build.log; echo "memsnap demo: the build failed; the whole log is $(BUILD)/build.log" >&2; exit 1; }
	@scripts/demo.sh $(BUILD)

# Only what the demo runs: the program, its interposer and the three samples, not the test suite
# and the benchmarks (make test and make bench build those).
DEMO_TARGETS = memsnap memsnap_preload sample_basic sample_train sample_record
demo-build: $(BUILD)/CMakeCache.txt
	$(CMAKE) --build $(BUILD) -j $(JOBS) --target $(DEMO_TARGETS)

# ctest hides the output of passing suites; the SKIP lines (no GPU, no fixtures, no browser) are
# printed after the run, counted, so that what did not run stays visible.
# (-DMS_BUILD_TESTS=ON: the suite also in a tree that a build without Criterion configured)
test: test-deps
	@$(MAKE) --no-print-directory $(BUILD)/CMakeCache.txt
	@$(CMAKE) -S . -B $(BUILD) -DMS_BUILD_TESTS=ON >/dev/null
	@$(MAKE) --no-print-directory build
	@cd $(BUILD) && { ctest --output-on-failure -j $(JOBS) $(if $(TESTS),-R '$(TESTS)'); rc=$$?; \
	  grep -h '^SKIP' Testing/Temporary/LastTest.log 2>/dev/null | sort | uniq -c | sed 's/^ */  skipped x/'; \
	  exit $$rc; }

# The module rule (docs/architecture.md): every #include of the project's files points down, and no
# file or function outgrows what one person holds in mind.
check:
	@scripts/check-deps.py
	@scripts/check-size.py

# Release trees (bench, wheel) are profile-guided: built instrumented, trained on PyTorch's
# snapshots, built again (scripts/pgo-build.sh; docs/performance.md "Release builds").
bench: deps
	@scripts/deps.sh bench
	JOBS=$(JOBS) CMAKE=$(CMAKE) scripts/pgo-build.sh build/bench-build -DCMAKE_BUILD_TYPE=Release \
	  -DMS_DEBUG=0 -DMS_BUILD_TESTS=OFF
	@bench/run.sh build/bench-build build/bench

# dist/memsnap-<version>-py3-none-linux_x86_64.whl from a Release tree: the command, the libraries
# and the third-party ones they need, and the Python package (docs/python.md)
wheel: deps
	@scripts/deps.sh wheel
	JOBS=$(JOBS) CMAKE=$(CMAKE) scripts/pgo-build.sh build/wheel-build -DCMAKE_BUILD_TYPE=Release \
	  -DMS_DEBUG=0 -DMS_BUILD_TESTS=OFF -DMS_BUILD_SAMPLES=OFF -DMS_BUILD_BENCH=OFF \
	  -- memsnap memsnap_preload
	python3 scripts/wheel.py build/wheel-build dist

fuzz:
	@scripts/deps.sh fuzz
	@scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf build build-asan build-tsan build-fuzz out dist
