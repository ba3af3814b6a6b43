// What the last ring call on this rank spent where, for the benchmark that writes
// docs/distributed.md's table (bench/ring_bench.cpp). Not part of the public API.
#pragma once

#include <time.h>

#include <chrono>

namespace sdpa::distributed::detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// CPU time of the calling thread: what a rank's compute costs whatever else shares its core.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct RingStats {
  double compute_seconds = 0;      // attention kernels and merges (wall clock)
  double compute_cpu_seconds = 0;  // the same, CPU time of the calling thread (all of it
                                   // with one OpenMP thread per rank)
  double wait_seconds = 0;         // blocked in MPI_Waitall: the exchange that compute did not hide
  double total_seconds = 0;        // the whole call, checks and agreement included
  double bytes_sent = 0;
  int steps_computed = 0, pieces_skipped = 0;
};

// The statistics of this process's last forward or backward call.
RingStats& last_ring_stats();

}  // namespace sdpa::distributed::detail
