#include "probes.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::bench {

namespace {

// Enough independent accumulators to cover latency × ports of any current core.
constexpr int kChains = 12;
constexpr long kIterations = 4'000'000;
// The best of several short trials, spread over more than a second: the machine is
// shared, and a vCPU can lose its slice for hundreds of milliseconds at a time.
constexpr int kTrials = 7;
constexpr auto kPause = std::chrono::milliseconds(150);

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The sum of every lane of the accumulators, stored and summed (GCC 12's
// _mm512_reduce_add_ps reads an uninitialised half).
__attribute__((target("avx512f"))) float sum_of_lanes(const __m512 (&acc)[kChains]) {
  float sink = 0;
  for (int c = 0; c < kChains; ++c) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[c]);
    for (float lane : lanes) sink += lane;
  }
  return sink;
}

__attribute__((target("avx512f"))) float fma_loop_avx512() {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  return sum_of_lanes(acc);
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2() {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  alignas(32) float lanes[8];
  float sink = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm256_store_ps(lanes, acc[c]);
    for (float x : lanes) sink += x;
  }
  return sink;
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_loop() {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 ones = _mm512_set1_ps(1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(ones, ones), b = _mm512_cvtne2ps_pbh(ones, ones);
  for (long i = 0; i < kIterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  return sum_of_lanes(acc);
}

volatile float g_sink;  // keeps the probe loops from being optimised away

// The sum of data[0, count − count mod (kStreams · step)) — the few floats past the last
// whole step of a thread's share are not read, and not counted (stream_read) — read as
// kStreams contiguous parts side by side, two vector accumulators each: the loads are
// what bounds it, not the adds. (A plain reduction loop compiled, without `-march`, to one
// scalar `addss` chain, 4 bytes per add latency: 6.0 GB/s on the Cascade Lake Xeon of
// bench/RESULTS.md, where this reads 21.9–23.5 GB/s, so decoding read as "150 % of the
// stream" there.)
constexpr std::size_t kStreams = 4;

// Floats in each of a share's kStreams parts: whole steps of `step` floats.
constexpr std::size_t stream_part(std::size_t count, std::size_t step) { return count / kStreams / step * step; }

__attribute__((target("avx512f"))) float stream_sum_avx512(const float* data, std::size_t count) {
  constexpr std::size_t kStep = 32;  // two zmm per stream per step
  const std::size_t part = stream_part(count, kStep);
  __m512 acc[2 * kStreams];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (std::size_t i = 0; i < part; i += kStep)
    for (std::size_t s = 0; s < kStreams; ++s) {
      acc[2 * s] = _mm512_add_ps(acc[2 * s], _mm512_loadu_ps(data + s * part + i));
      acc[2 * s + 1] = _mm512_add_ps(acc[2 * s + 1], _mm512_loadu_ps(data + s * part + i + 16));
    }
  float sum = 0;
  for (const __m512& a : acc) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, a);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}

__attribute__((target("avx2"))) float stream_sum_avx2(const float* data, std::size_t count) {
  constexpr std::size_t kStep = 16;  // two ymm per stream per step
  const std::size_t part = stream_part(count, kStep);
  __m256 acc[2 * kStreams];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (std::size_t i = 0; i < part; i += kStep)
    for (std::size_t s = 0; s < kStreams; ++s) {
      acc[2 * s] = _mm256_add_ps(acc[2 * s], _mm256_loadu_ps(data + s * part + i));
      acc[2 * s + 1] = _mm256_add_ps(acc[2 * s + 1], _mm256_loadu_ps(data + s * part + i + 8));
    }
  float sum = 0;
  for (const __m256& a : acc) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, a);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}

// Baseline x86-64 (SSE2), for a CPU or VM without AVX2.
float stream_sum_sse2(const float* data, std::size_t count) {
  constexpr std::size_t kStep = 8;  // two xmm per stream per step
  const std::size_t part = stream_part(count, kStep);
  __m128 acc[2 * kStreams];
  for (__m128& a : acc) a = _mm_setzero_ps();
  for (std::size_t i = 0; i < part; i += kStep)
    for (std::size_t s = 0; s < kStreams; ++s) {
      acc[2 * s] = _mm_add_ps(acc[2 * s], _mm_loadu_ps(data + s * part + i));
      acc[2 * s + 1] = _mm_add_ps(acc[2 * s + 1], _mm_loadu_ps(data + s * part + i + 4));
    }
  float sum = 0;
  for (const __m128& a : acc) {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, a);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}

}  // namespace

// Shortest time of kTrials runs of `loop` on every thread.
template <class Loop>
double best_seconds(int threads, Loop loop) {
  double best = 1e300;
  for (int trial = 0; trial < kTrials; ++trial) {
    if (trial > 0) std::this_thread::sleep_for(kPause);
    float sink = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += loop();
    best = std::min(best, seconds_since(start));
    g_sink = sink;
  }
  return best;
}

Probe fma_peak(int threads) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return {0, "vfmadd231ps (not on this CPU)"};
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const double seconds = best_seconds(threads, avx512 ? fma_loop_avx512 : fma_loop_avx2);
  const double lanes = avx512 ? 16 : 8;
  return {2.0 * lanes * kChains * kIterations * threads / seconds / 1e9,
          avx512 ? "vfmadd231ps zmm (float32)" : "vfmadd231ps ymm (float32)"};
}

Probe bf16_dot_peak(int threads) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16")) return {0, "vdpbf16ps (not on this CPU)"};
  const double seconds = best_seconds(threads, bf16_loop);
  return {4.0 * 16 * kChains * kIterations * threads / seconds / 1e9, "vdpbf16ps zmm (bfloat16 pairs)"};
}

namespace {
constexpr std::size_t kCount = std::size_t{1} << 27;  // 512 MiB of float32
constexpr std::size_t kLine = 16;                     // floats in a 64-byte line
// Thread t of n reads floats [share_begin(t, n), share_begin(t + 1, n)): each share
// starts on a line, so no load straddles two.
std::size_t share_begin(std::size_t t, std::size_t n) { return kCount / kLine * t / n * kLine; }

// The buffer on the memory a Tensor's storage gets (huge pages where the kernel gives
// them), so that the read and the decodes compared with it run on the same kind of pages.
// Null if there is not enough.
float* allocate_buffer() {
  try {
    return reinterpret_cast<float*>(sdpa::detail::TensorAllocator().allocate(kCount * sizeof(float)));
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
}  // namespace

StreamReader::StreamReader(int threads) : threads_(threads), data_(allocate_buffer()) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  sum_ = avx512 ? stream_sum_avx512 : avx2 ? stream_sum_avx2 : stream_sum_sse2;
  step_ = avx512 ? 32 : avx2 ? 16 : 8;  // the floats a stream reads per step
  what_ = avx512 ? "sum of 512 MiB float32, 4 streams a thread, zmm loads"
          : avx2 ? "sum of 512 MiB float32, 4 streams a thread, ymm loads"
                 : "sum of 512 MiB float32, 4 streams a thread, xmm loads";
  if (!data_) return;
  float* data = data_;
#pragma omp parallel num_threads(threads)
  {
    // Each thread first touches the pages it will read (its memory node's, where that matters).
    const auto t = static_cast<std::size_t>(omp_get_thread_num()), n = static_cast<std::size_t>(omp_get_num_threads());
    for (std::size_t i = share_begin(t, n); i < share_begin(t + 1, n); ++i) data[i] = static_cast<float>(i & 1023);
  }
}

StreamReader::~StreamReader() {
  if (data_) sdpa::detail::TensorAllocator().deallocate(reinterpret_cast<std::byte*>(data_), kCount * sizeof(float));
}

double StreamReader::read_gbs() {
  if (!data_) return 0;
  float total = 0;
  std::size_t bytes = 0;
  const auto sum = sum_;
  const std::size_t step = step_;
  const float* data = data_;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads_) reduction(+ : total, bytes)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num()), n = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t begin = share_begin(t, n), share = share_begin(t + 1, n) - begin;
    total += sum(data + begin, share);
    bytes += stream_part(share, step) * kStreams * sizeof(float);
  }
  const double seconds = seconds_since(start);
  g_sink = total;
  return static_cast<double>(bytes) / seconds / 1e9;
}

Probe stream_read(StreamReader& reader) {
  if (!reader.ready()) return {0, "streaming read (no memory for its buffer)"};
  double best = 0;
  for (int repeat = 0; repeat < 3; ++repeat) best = std::max(best, reader.read_gbs());
  return {best, reader.what()};
}

}  // namespace sdpa::bench
