# Two commands on a fresh Debian 12 machine: `make demo` and `make test`. Each installs
# what is missing (scripts/setup.sh, scripts/python_env.sh), configures and builds.
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
PYTHON := $(CURDIR)/.venv/bin/python

.PHONY: all setup python python-package build demo test test-release test-python test-wheel test-examples test-sanitize test-fuzz clean

all: build

setup:
	@scripts/setup.sh

python: setup
	@scripts/python_env.sh

# The sdpa Python package, built and installed into .venv (skipped when its sources are
# unchanged since the last install).
python-package: python
	@scripts/python_env.sh --package

build: setup python
	cmake --preset release -DSDPA_PYTHON=$(PYTHON) > /dev/null
	cmake --build --preset release -j $(JOBS)

demo: build
	./build/release/sdpa demo

# Every test: the C++ suite and the CLI checks, the C++ suite again under ASan + UBSan,
# then the .npy fuzzer for FUZZ_SECONDS and the safetensors fuzzer for 30 s.
# The Python package's suite (pytest + hypothesis against PyTorch) runs after the C++ suite,
# then the wheel (scripts/check_wheel.sh: `pip wheel .` in a throw-away venv with NumPy
# alone) and the training example (examples/tiny_lm.py: sdpa's backward against torch's,
# step by step).
test: test-release test-python test-wheel test-examples test-sanitize test-fuzz

test-release: build
	ctest --preset release -j $(JOBS)

test-python: python-package
	SDPA_MIN_EXAMPLES=2000 $(PYTHON) -m pytest python/tests -q

# After python-package, which leaves the wheel's build folder (build/python/) current.
test-wheel: python-package
	scripts/check_wheel.sh

test-examples: python-package
	$(PYTHON) examples/tiny_lm.py

test-sanitize: setup
	cmake --preset sanitize > /dev/null
	cmake --build --preset sanitize -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset sanitize -j $(JOBS)

test-fuzz: setup
	cmake --preset fuzz > /dev/null
	cmake --build --preset fuzz -j $(JOBS) --target npy_fuzzer safetensors_fuzzer
	fuzz/run.sh build/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build
