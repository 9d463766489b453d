# Thin wrapper over CMake's presets (CMakePresets.json is the one source of build configurations).
# `make run` and `make test` install what is missing first; `make check` is the inner loop.
# The release preset's binaryDir.
BUILD = build
JOBS ?= 2
DATA ?= ./data
SOURCES = $(shell git ls-files '*.cc' '*.h' 2>/dev/null)

.PHONY: deps test-deps build check run cluster test api-check image-lint image-check bench format format-check clean

deps:
	scripts/install-deps.sh

test-deps:
	scripts/install-deps.sh --tests

build: deps
	cmake --preset release
	cmake --build --preset release

# The inner loop: build, then the unit tests of core, storage and server (ctest label `unit`), in
# about a minute once the build is warm. `make test` runs everything.
check: build
	ctest --preset check

# The broker with its embedded defaults: gRPC on 127.0.0.1:7070, HTTP on 127.0.0.1:8080.
run: build
	$(BUILD)/server/jobbroker --listen 127.0.0.1:7070 --http-listen 127.0.0.1:8080 --data-dir $(DATA)

# Cluster mode on this machine: etcd and three nodes (scripts/cluster.sh; docs/cluster.md).
cluster: build
	BUILD=$(BUILD) scripts/cluster.sh

# Every test: style, unit, storage, end-to-end against the real binary, the API checks, and
# every client language against the real binary. `scripts/test-all.sh python` runs one suite.
test: test-deps build format-check
	BUILD=$(BUILD) JOBS=$(JOBS) scripts/test-all.sh

api-check:
	scripts/api-check.sh

# The Dockerfile's lint (hadolint), and the image built and run for real with podman.
image-lint:
	tests/image/lint.sh

image-check: test-deps build
	scripts/image-check.sh

bench: build
	BUILD_DIR=$(BUILD) bench/run.sh

format:
	clang-format -i $(SOURCES)

format-check:
	clang-format --dry-run --Werror $(SOURCES)

clean:
	rm -rf $(BUILD)
