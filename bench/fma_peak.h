#pragma once

namespace sdpa::bench {

struct PeakProbe {
  double gflops;           // float32 FMA throughput, all threads
  const char* instruction; // what was measured
  double sink;             // keeps the loop alive
};

// Measures the float32 FMA peak with `threads` threads (about a second).
PeakProbe measure_fma_peak(int threads);

}  // namespace sdpa::bench
