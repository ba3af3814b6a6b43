// One shape's best time over many calls, for comparing two builds on a machine whose
// speed drifts: build each, then run their binaries alternately (bench/RESULTS.md, "The
// forward's fixed work"). With one thread the time is the calling thread's CPU time
// (the host's preemption does not count), with more the wall time.
//
//   sdpa_ab_loop B Hq Hkv L S E causal calls [threads] [backward]
//
// prints GFLOP/s (FlashAttention's count: 4·B·Hq·L·S·E, half when causal, ×2.5 for the
// backward) or, for L = 1, GB/s of K and V, and the best time.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "sdpa/sdpa.h"

namespace {

double seconds(bool cpu_time) {
  timespec t;
  clock_gettime(cpu_time ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

sdpa::Tensor random_tensor(std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-0.5, 0.5);
  sdpa::Tensor t(sdpa::DType::float32, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, uniform(rng));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9 || argc > 11) {
    std::fprintf(stderr, "usage: %s B Hq Hkv L S E causal calls [threads=1] [backward=0]\n", argv[0]);
    return 2;
  }
  std::int64_t n[8];
  for (int i = 0; i < 8; ++i) n[i] = std::stoll(argv[i + 1]);
  const auto [B, Hq, Hkv, L, S, E] = std::tuple{n[0], n[1], n[2], n[3], n[4], n[5]};
  const bool causal = n[6] != 0, backward = argc > 10 && std::stoi(argv[10]) != 0;
  const std::int64_t calls = n[7];
  const int threads = argc > 9 ? std::stoi(argv[9]) : 1;
  std::mt19937_64 rng(1);
  const sdpa::Tensor q = random_tensor({B, Hq, L, E}, rng), k = random_tensor({B, Hkv, S, E}, rng),
                     v = random_tensor({B, Hkv, S, E}, rng), grad_output = random_tensor({B, Hq, L, E}, rng);
  sdpa::Tensor out(sdpa::DType::float32, {B, Hq, L, E}), lse(sdpa::DType::float32, {B, Hq, L}),
      dq(sdpa::DType::float32, {B, Hq, L, E}), dk(sdpa::DType::float32, {B, Hkv, S, E}),
      dv(sdpa::DType::float32, {B, Hkv, S, E});
  sdpa::Options options;
  options.num_threads = threads;
  if (causal) options.causal = sdpa::Causal::bottom_right;
  try {
    sdpa::forward(q.view(), k.view(), v.view(), {out.view(), {}, lse.view()}, options);
    double best = 1e300;
    for (std::int64_t call = 0; call < calls; ++call) {
      const double start = seconds(threads == 1);
      if (backward)
        sdpa::backward({q.view(), k.view(), v.view(), out.view(), lse.view(), grad_output.view()},
                       {dq.view(), dk.view(), dv.view()}, options);
      else
        sdpa::forward(q.view(), k.view(), v.view(), {out.view(), {}, {}}, options);
      best = std::min(best, seconds(threads == 1) - start);
    }
    const auto d = [](std::int64_t x) { return static_cast<double>(x); };
    if (L == 1 && !backward)
      std::printf("%.2f GB/s  best %.3f ms\n", 8.0 * d(B * Hkv * S * E) / best * 1e-9, best * 1e3);
    else
      std::printf("%.1f GFLOP/s  best %.3f ms\n",
                  4.0 * d(B * Hq * L) * d(S * E) * (causal ? 0.5 : 1.0) * (backward ? 2.5 : 1.0) / best * 1e-9,
                  best * 1e3);
  } catch (const sdpa::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
