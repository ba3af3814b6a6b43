#!/usr/bin/env bash
# The installed C++ package, used as a consumer would: `cmake --install` of this build
# into a temporary prefix, then the consumer project (tests/package/) built against it
# through find_package(sdpa CONFIG) and, separately, through pkg-config. The consumers'
# hello_attention must print exactly what the build tree's does (the same library,
# installed), causal_layer checks a property of sdpa::nn, and the installed CLI runs.
# Usage: check_install.sh BUILD_DIR PACKAGE_DIR HELLO_SOURCE HELLO_IN_TREE
set -euo pipefail
build_dir=$1 package_dir=$2 hello_source=$3 hello_in_tree=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
expected=$("$hello_in_tree")
if find "$work/prefix/include" -name '*-inl.h' -o -name 'problem.h' | grep -q .; then
  echo "private headers were installed:"; find "$work/prefix/include"; exit 1
fi

cmake -S "$package_dir" -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" -DHELLO_ATTENTION_SOURCE="$hello_source" > "$work/configure.log"
cmake --build "$work/cmake" > "$work/build.log"
[[ "$("$work/cmake/hello_attention")" == "$expected" ]] || { echo "find_package: hello_attention differs"; exit 1; }
"$work/cmake/causal_layer"

pc=$(find "$work/prefix" -name sdpa.pc)
export PKG_CONFIG_PATH=$(dirname "$pc")
read -r -a flags <<< "$(pkg-config --cflags --libs sdpa)"
c++ -std=c++20 -O2 "$hello_source" "${flags[@]}" -o "$work/hello_pc"
c++ -std=c++20 -O2 "$package_dir/causal_layer.cpp" "${flags[@]}" -o "$work/causal_pc"
[[ "$("$work/hello_pc")" == "$expected" ]] || { echo "pkg-config: hello_attention differs"; exit 1; }
"$work/causal_pc"

version=$("$work/prefix/bin/sdpa" --version)
[[ $version == "sdpa $(pkg-config --modversion sdpa)" ]] || { echo "installed CLI: $version"; exit 1; }
echo "package: ok ($version)"
