#!/usr/bin/env bash
# Creates the project's Python environment at .venv and reuses it: a second run downloads
# nothing. NumPy for the CLI's conformance test; PyTorch, pytest and hypothesis for the
# Python package's suite, transformers for its integration's tests (small models built from
# config classes, no weights); nanobind and scikit-build-core to build that package.
#
# With --package it also builds the sdpa package (pyproject.toml) and installs it into
# .venv: only when its sources changed since the last install, and without downloading
# anything (no build isolation, no package index; the C++ build is incremental under
# build/python/).
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=scripts/requirements.txt
stamp=.venv/.installed-requirements
if ! [[ -x .venv/bin/python && -f $stamp ]] || ! cmp -s "$requirements" "$stamp"; then
  python_bin=$(command -v python3)
  [[ -x .venv/bin/python ]] || "$python_bin" -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
fi

[[ ${1:-} == --package ]] || exit 0

# What the extension and the CLI it ships are built from (the tests are not part of them,
# but for tests/testing, which `sdpa check` links).
sources=$(find pyproject.toml CMakeLists.txt include src apps tests/testing python/CMakeLists.txt python/src python/sdpa \
            -type f -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum | sha256sum)
package_stamp=.venv/.installed-package
if [[ -f $package_stamp && "$(cat "$package_stamp")" == "$sources" ]] && .venv/bin/python -c 'import sdpa' 2>/dev/null; then
  exit 0
fi
echo "python_env: building the sdpa package into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps --no-index .
echo "$sources" > "$package_stamp"
