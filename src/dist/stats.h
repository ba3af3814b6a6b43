// What the last ring call on this rank spent where, for the benchmark that writes
// docs/distributed.md's table (bench/ring_bench.cpp). Not part of the public API.
#pragma once

namespace sdpa::distributed::detail {

struct RingStats {
  double compute_seconds = 0;      // attention kernels and merges (wall clock)
  double compute_cpu_seconds = 0;  // the same, CPU time of the calling thread (all of it
                                   // with one OpenMP thread per rank)
  double wait_seconds = 0;     // blocked in MPI_Waitall: the exchange that compute did not hide
  double total_seconds = 0;    // the whole call, checks and agreement included
  double bytes_sent = 0;
  int steps_computed = 0, pieces_skipped = 0;
};

// The statistics of this process's last forward or backward call.
RingStats& last_ring_stats();

}  // namespace sdpa::distributed::detail
