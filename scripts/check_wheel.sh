#!/usr/bin/env bash
# The wheel as a user gets it: `pip wheel .` from this tree, installed into a throw-away
# virtual environment (under a temporary directory, removed afterwards) with nothing but
# its one dependency, NumPy. Checks that `import sdpa` works without torch (NumPy arrays
# in, NumPy arrays out, equal to the formula) and that the `sdpa` console script runs the
# CLI shipped inside the wheel (`sdpa --version` names the package's version).
#
# Cheap to repeat: the wheel is built without build isolation from .venv's scikit-build-core
# and nanobind, in the persistent build folder build/python/ that `make python-package` keeps
# current (nothing is compiled again when the sources are unchanged), and NumPy comes from
# pip's cache at .venv's version (nothing else is installed: no torch).
set -euo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
work=$(mktemp -d "${TMPDIR:-/tmp}/sdpa-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "check_wheel: $*" >&2; exit 1; }

"$python" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps --no-index \
  --wheel-dir "$work/dist" .
wheels=("$work"/dist/sdpa-*.whl)
[[ ${#wheels[@]} == 1 && -f ${wheels[0]} ]] || fail "expected one sdpa wheel in $work/dist, got: ${wheels[*]}"
wheel=${wheels[0]}
"$python" -c 'import sys, zipfile; sys.exit("sdpa/bin/sdpa" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel" ||
  fail "the wheel has no sdpa/bin/sdpa (the CLI)"

# A fresh environment from the interpreter .venv was made from, with the wheel and NumPy only.
base=$("$python" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$work/venv"
numpy_version=$("$python" -c 'import numpy; print(numpy.__version__)')
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" "numpy==$numpy_version"
# What venv itself brings (pip; setuptools before Python 3.12) aside, nothing but these two.
installed=$("$work/venv/bin/python" -m pip list --format=freeze --disable-pip-version-check | cut -d= -f1 |
  grep -vxE 'pip|setuptools|wheel' | sort | tr '\n' ' ')
[[ $installed == "numpy sdpa " ]] || fail "expected only numpy and sdpa in the fresh environment, got: $installed"

# From inside the temporary directory: the repository's python/ is nowhere on the path.
cd "$work"
version=$(venv/bin/python - <<'PY'
import importlib.util
import sys

import numpy as np

import sdpa

assert importlib.util.find_spec("torch") is None, "torch is installed in the fresh environment"
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 4, 9, 16)).astype(np.float32) for _ in range(3))
out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
assert type(out) is np.ndarray and out.dtype == np.float32 and out.shape == (2, 4, 9, 16), (type(out), out.dtype)
# The formula in float64: softmax(q kᵀ / sqrt(16), causal) v.
s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / 4.0
s[..., np.triu(np.ones((9, 9), dtype=bool), 1)] = -np.inf
w = np.exp(s - s.max(-1, keepdims=True))
reference = (w / w.sum(-1, keepdims=True)) @ v.astype(np.float64)
error = float(np.abs(out - reference).max())
assert error <= 1e-5 * float(np.abs(reference).max()), f"max error {error}"
assert "torch" not in sys.modules
print(sdpa.__version__)
PY
)
cli=$(venv/bin/sdpa --version)
[[ $cli == "sdpa $version" ]] || fail "expected 'sdpa --version' to print 'sdpa $version', got '$cli'"
echo "check_wheel: $(basename "$wheel") installs with NumPy alone; import sdpa without torch, NumPy in and out; $cli"
