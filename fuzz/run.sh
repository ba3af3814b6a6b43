#!/usr/bin/env bash
# Runs the .npy fuzzer for a fixed time, then the safetensors fuzzer for
# SAFETENSORS_SECONDS (default 30), each from a freshly generated seed corpus.
#   fuzz/run.sh <build_dir> <seconds>      e.g. fuzz/run.sh build/fuzz 60
# Exits non-zero on a finding; the crashing input is kept in <build_dir>/fuzz-artifacts/.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 <build_dir> <seconds>" >&2
  exit 2
fi
build_dir=$1
seconds=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fuzzer="$build_dir/fuzz/npy_fuzzer"
if [[ ! -x $fuzzer ]]; then
  echo "$fuzzer not found: build it first (cmake --preset fuzz && cmake --build --preset fuzz)" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/make_corpus.py" "$work/corpus"

# The tokens of the header grammar: libFuzzer splices them in, which reaches the parser's
# deeper states far sooner than byte flips alone.
cat >"$work/npy.dict" <<'DICT'
"\x93NUMPY"
"\x01\x00"
"\x02\x00"
"\x03\x00"
"{"
"}"
"'descr'"
"'fortran_order'"
"'shape'"
"True"
"False"
"'<f2'"
"'<f4'"
"'<f8'"
"'>f4'"
"'|b1'"
"'?'"
"()"
"(0,)"
"9223372036854775807"
"4294967296"
DICT

artifacts="$(cd "$build_dir" && pwd)/fuzz-artifacts/"
mkdir -p "$artifacts"
# rss/malloc limits turn an allocation sized by an unchecked header field into a finding.
"$fuzzer" "$work/corpus" -dict="$work/npy.dict" -max_total_time="$seconds" -max_len=4096 \
  -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$artifacts" -print_final_stats=1

# The safetensors parser: the tokens of its JSON header as the dictionary.
safetensors_fuzzer="$build_dir/fuzz/safetensors_fuzzer"
if [[ ! -x $safetensors_fuzzer ]]; then
  echo "$safetensors_fuzzer not found: build it first (cmake --build --preset fuzz)" >&2
  exit 2
fi
python3 "$here/make_safetensors_corpus.py" "$work/st_corpus"
cat >"$work/safetensors.dict" <<'DICT'
"{"
"}"
"["
"]"
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"F64\""
"\"F16\""
"\"BF16\""
"\"BOOL\""
"\"I64\""
"18446744073709551615"
"9223372036854775808"
"4294967296"
DICT
"$safetensors_fuzzer" "$work/st_corpus" -dict="$work/safetensors.dict" -max_total_time="${SAFETENSORS_SECONDS:-30}" \
  -max_len=4096 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$artifacts" -print_final_stats=1
