#!/usr/bin/env bash
# The measurements of docs/distributed.md's table (bench/ring_bench.cpp), with the load
# before and after each: timings taken while the 1-minute load is above 1 are not valid on
# a shared machine. Usage: bench/ring_table.sh [BUILD_DIR] [L]
set -euo pipefail
build=${1:-build/release}
L=${2:-16384}
bench=$build/bench/sdpa_ring_bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lscpu | grep -E "Model name|CPU family|^Model:" | tr -s ' '
load() { cut -d' ' -f1 /proc/loadavg; }
run() { local before; before=$(load); "$@"; echo "  (load before $before, after $(load))"; }
run env OMP_NUM_THREADS=2 "$bench" "$L" 128 1 single 3
run env OMP_NUM_THREADS=1 "$bench" "$L" 128 1 single 3
for np in 2 4; do
  for partition in zigzag contiguous; do
    run mpirun -np "$np" --oversubscribe -x OMP_NUM_THREADS=1 "$bench" "$L" 128 1 "$partition" ring 3
  done
  run mpirun -np "$np" --oversubscribe -x OMP_NUM_THREADS=1 "$bench" "$L" 128 1 zigzag all_gather 3
done
