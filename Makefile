# pathkernel: the two commands a newcomer needs are `make test` and `make demo`.
# Both install what is missing first (`make deps`), then build.

BUILD ?= build
JOBS ?= $(shell nproc)
DEMO_RUN ?= runs/demo-mnist

.PHONY: all deps build test demo bench clean test-sanitize fuzz

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release > /dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)/pathkernel $(DEMO_RUN)

# The benchmark suite: Release build, every ratio side by side, bench/results.json.
bench:
	@bash scripts/deps.sh --bench
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPATHKERNEL_BUILD_BENCH=ON > /dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target pathkernel pathkernel_bench
	@$(BUILD)/pathkernel_bench $(BENCH_ARGS)

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer (docs/fuzzing.md).
test-sanitize: deps
	@bash scripts/test-sanitize.sh

# Every reader's libFuzzer harness for FUZZ_SECONDS (default 60) each (docs/fuzzing.md).
fuzz:
	@bash scripts/deps.sh --fuzz
	@bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-sanitize build-fuzz
