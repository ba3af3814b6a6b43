#!/usr/bin/env bash
# Creates the project's Python environment at .venv (NumPy for the CLI's conformance
# test) and reuses it: a second run downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=scripts/requirements.txt
stamp=.venv/.installed-requirements
if [[ -x .venv/bin/python && -f $stamp ]] && cmp -s "$requirements" "$stamp"; then
  exit 0
fi
python_bin=$(command -v python3)
[[ -x .venv/bin/python ]] || "$python_bin" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements"
cp "$requirements" "$stamp"
