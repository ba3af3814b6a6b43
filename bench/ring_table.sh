#!/usr/bin/env bash
# The measurements of docs/distributed.md's table (bench/ring_bench.cpp), with the load
# before and after each: timings taken while the 1-minute load is above 1 are not valid on
# a shared machine. Usage: bench/ring_table.sh [BUILD_DIR] [L] [all|ordered]
# `ordered` runs only the float64 comparison of the ring and the ordered exchange (np = 2,
# zigzag, one thread per rank, beside the single process on 1 and 2 threads).
set -euo pipefail
build=${1:-build/release}
L=${2:-16384}
part=${3:-all}
bench=$build/bench/sdpa_ring_bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lscpu | grep -E "Model name|CPU family|^Model:" | tr -s ' '
load() { cut -d' ' -f1 /proc/loadavg; }
run() { local before; before=$(load); "$@"; echo "  (load before $before, after $(load))"; }
if [[ $part == ordered ]]; then
  run env OMP_NUM_THREADS=2 "$bench" "$L" 128 1 single 3 -1 float64
  run env OMP_NUM_THREADS=1 "$bench" "$L" 128 1 single 3 -1 float64
  for exchange in ring ordered; do
    run mpirun -np 2 -x OMP_NUM_THREADS=1 "$bench" "$L" 128 1 zigzag "$exchange" 3 -1 float64
  done
  run mpirun -np 2 -x OMP_NUM_THREADS=1 "$bench" "$L" 128 1 zigzag ordered 3 -1 float32
  exit 0
fi
run env OMP_NUM_THREADS=2 "$bench" "$L" 128 1 single 3
run env OMP_NUM_THREADS=1 "$bench" "$L" 128 1 single 3
for np in 2 4; do
  for partition in zigzag contiguous; do
    run mpirun -np "$np" --oversubscribe -x OMP_NUM_THREADS=1 "$bench" "$L" 128 1 "$partition" ring 3
  done
  run mpirun -np "$np" --oversubscribe -x OMP_NUM_THREADS=1 "$bench" "$L" 128 1 zigzag all_gather 3
done
