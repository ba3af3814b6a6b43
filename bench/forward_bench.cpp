// Forward throughput of the CPU path: GFLOP/s (FlashAttention's count: 4·B·Hq·L·S·E,
// half when causal with L = S) and the fraction of the FMA peak measured in the same
// run. Run: build/release/bench/sdpa_forward_bench
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>

#include "probes.h"
#include "sdpa/sdpa.h"

namespace {

double g_peak_gflops = 0;

void BM_Forward(benchmark::State& state) {
  const std::int64_t heads_q = 16, heads_kv = state.range(0), L = state.range(1), E = state.range(2);
  const bool causal = state.range(3) != 0;
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal;
  auto random = [&](std::vector<std::int64_t> shape) {
    sdpa::Tensor t(sdpa::DType::float32, std::move(shape));
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
    return t;
  };
  const sdpa::Tensor q = random({1, heads_q, L, E}), k = random({1, heads_kv, L, E}), v = random({1, heads_kv, L, E});
  sdpa::Tensor out(sdpa::DType::float32, {1, heads_q, L, E});
  sdpa::Options options;
  options.causal = causal ? sdpa::Causal::top_left : sdpa::Causal::none;
  for (auto _ : state) sdpa::forward(q.view(), k.view(), v.view(), {out.view(), {}, {}}, options);
  const double flops = 4.0 * heads_q * L * L * E * (causal ? 0.5 : 1.0);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GFLOP/s"] = g_peak_gflops;
}

}  // namespace

BENCHMARK(BM_Forward)
    ->ArgNames({"Hkv", "L", "E", "causal"})
    ->ArgsProduct({{16, 4}, {512, 2048}, {64, 128}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

int main(int argc, char** argv) {
  g_peak_gflops = sdpa::bench::fma_peak(omp_get_max_threads()).rate;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
}
