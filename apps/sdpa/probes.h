// Machine probes measured in the same run as the benchmarks, so that figures can be
// quoted as a fraction of what this machine does right now (it is shared and noisy).
#pragma once

namespace sdpa::bench {

struct Probe {
  double rate = 0;              // GFLOP/s for compute probes, GB/s for bandwidth
  const char* what = "";        // the instruction or access pattern measured
};

// float32 FMA throughput on `threads` threads: independent chains of the widest FMA.
Probe fma_peak(int threads);
// vdpbf16ps throughput (2 multiply-adds per lane per instruction); rate 0 when the CPU
// lacks AVX-512 BF16.
Probe bf16_dot_peak(int threads);
// Streaming-read bandwidth: `threads` threads summing a buffer much larger than the
// caches.
Probe stream_read(int threads);

}  // namespace sdpa::bench
