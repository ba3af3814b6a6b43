// The backward's extra memory at long context (DESIGN.md §5: O(threads × tile)): peak
// RSS around one sdpa::backward call whose inputs and gradient buffers already exist.
//
//   build/release/bench/sdpa_backward_memory [L = S (default 131072)] [E (default 64)]
//
// B = H = 1, causal, float32, all threads. Prints the peak RSS before and after the call.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "sdpa/sdpa.h"

namespace {

long peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;  // KiB on Linux
}

sdpa::Tensor filled(std::int64_t n, std::int64_t e, std::mt19937& rng) {
  sdpa::Tensor t(sdpa::DType::float32, {1, 1, n, e});
  std::normal_distribution<float> normal;
  auto* data = static_cast<float*>(t.data());
  for (std::int64_t i = 0; i < t.numel(); ++i) data[i] = normal(rng);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : 131072, e = argc > 2 ? std::atoll(argv[2]) : 64;
  std::mt19937 rng(1);
  const sdpa::Tensor q = filled(n, e, rng), k = filled(n, e, rng), v = filled(n, e, rng), dout = filled(n, e, rng);
  sdpa::Options options;
  options.causal = sdpa::Causal::top_left;
  const sdpa::ForwardResult f = sdpa::forward(q.view(), k.view(), v.view(), options, {.lse = true});
  // Touched, so that their pages count before the call.
  sdpa::Tensor dq = filled(n, e, rng), dk = filled(n, e, rng), dv = filled(n, e, rng);
  const long before = peak_rss_mib();
  sdpa::backward({q.view(), k.view(), v.view(), f.output.view(), f.lse.view(), dout.view()},
                 {dq.view(), dk.view(), dv.view(), std::nullopt}, options);
  const long after = peak_rss_mib();
  std::printf("L = S = %lld, E = %lld: peak RSS %ld MiB before the backward, %ld MiB after: %ld MiB extra\n",
              static_cast<long long>(n), static_cast<long long>(e), before, after, after - before);
}
