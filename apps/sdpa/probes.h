// Machine probes measured in the same run as the benchmarks, so that figures can be
// quoted as a fraction of what this machine does right now (it is shared and noisy).
#pragma once

#include <cstddef>

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
// The streaming-read probe's buffer (512 MiB), kept to time single reads beside another
// measurement: on a shared host the memory's speed moves by 2× within minutes (30 to 54
// GB/s on the Zen 4 of bench/RESULTS.md), so a decode's fraction of a read timed just
// before it says more about the kernel than its fraction of the probe's best moment.
class StreamReader {
 public:
  explicit StreamReader(int threads);
  ~StreamReader();
  StreamReader(const StreamReader&) = delete;
  StreamReader& operator=(const StreamReader&) = delete;

  bool ready() const { return data_ != nullptr; }  // false: no memory for the buffer
  double read_gbs();                               // one timed read of the whole buffer (0 if not ready)
  const char* what() const { return what_; }

 private:
  int threads_;
  float* data_;
  float (*sum_)(const float*, std::size_t) = nullptr;
  std::size_t step_ = 0;
  const char* what_ = "";
};

// Streaming-read bandwidth: the reader's threads summing its buffer, much larger than the
// caches (the best of three reads).
Probe stream_read(StreamReader& reader);

}  // namespace sdpa::bench
