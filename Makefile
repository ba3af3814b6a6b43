# Two commands on a fresh Debian 12 machine: `make demo` and `make test`. Each installs
# what is missing (scripts/setup.sh, scripts/python_env.sh), configures and builds.
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
PYTHON := $(CURDIR)/.venv/bin/python

.PHONY: all setup python build demo test test-release test-sanitize test-fuzz clean

all: build

setup:
	@scripts/setup.sh

python: setup
	@scripts/python_env.sh

build: setup python
	cmake --preset release -DSDPA_PYTHON=$(PYTHON) > /dev/null
	cmake --build --preset release -j $(JOBS)

demo: build
	./build/release/sdpa demo

# Every test: the C++ suite and the CLI checks, the C++ suite again under ASan + UBSan,
# then the .npy fuzzer for FUZZ_SECONDS.
test: test-release test-sanitize test-fuzz

test-release: build
	ctest --preset release -j $(JOBS)

test-sanitize: setup
	cmake --preset sanitize > /dev/null
	cmake --build --preset sanitize -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset sanitize -j $(JOBS)

test-fuzz: setup
	cmake --preset fuzz > /dev/null
	cmake --build --preset fuzz -j $(JOBS) --target npy_fuzzer
	fuzz/run.sh build/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build
