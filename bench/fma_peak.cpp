// The machine's measured float32 FMA peak: independent FMA chains on every thread, long
// enough to hide the FMA latency (8 chains × 4-cycle latency ≥ 2 ports × 4 cycles).
#include "fma_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <chrono>

namespace sdpa::bench {

namespace {

constexpr int kChains = 12;

__attribute__((target("avx512f"))) double fma_loop_avx512(long iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  float sink = 0;
  for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
  return sink;
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(long iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  alignas(32) float lanes[8];
  float sink = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm256_store_ps(lanes, acc[c]);
    for (float x : lanes) sink += x;
  }
  return sink;
}

}  // namespace

PeakProbe measure_fma_peak(int threads) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const int lanes = avx512 ? 16 : 8;
  const long iterations = 20'000'000;
  double sink = 0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += avx512 ? fma_loop_avx512(iterations) : fma_loop_avx2(iterations);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double flops = 2.0 * lanes * kChains * static_cast<double>(iterations) * threads;
  return {flops / seconds / 1e9, avx512 ? "avx512f fma" : "avx2 fma", sink};
}

}  // namespace sdpa::bench
