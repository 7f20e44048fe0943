# pathkernel: the two commands a newcomer needs are `make test` and `make demo`.
# Both install what is missing first (`make deps`), then build.

BUILD ?= build
JOBS ?= $(shell nproc)
DEMO_RUN ?= runs/demo-mnist

.PHONY: all deps build test demo clean

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

clean:
	rm -rf $(BUILD)
