// One shape's best time over many calls, for comparing two builds on a machine whose
// speed drifts: build each, then run their binaries alternately (bench/RESULTS.md, "The
// forward's fixed work"). With one thread the time is the calling thread's CPU time
// (the host's preemption does not count), with more the wall time.
//
//   sdpa_ab_loop B Hq Hkv L S E causal calls [threads] [backward] [dtype]
//
// dtype: float32 (the default), bfloat16, float16, or int8-kv (bfloat16 Q, K and V int8
// with a scale per row, quantize_kv); packed, Ev = E; causal is bottom-right. Prints
// GFLOP/s (FlashAttention's count: 4·B·Hq·L·S·E, half when causal — exact only for
// L = S — and ×2.5 for the backward) or, for a forward with L = 1, GB/s of K and V (and
// their scales); and the best call's time.
//
// SDPA_AB_BFLOAT16=vdpbf16ps or widened in the environment forces the arithmetic bfloat16
// takes (through the tests' hook, bf16::choose_for_test), so that one build compares the
// two on a CPU that has vdpbf16ps (bench/RESULTS.md, "An Intel Xeon (Emerald Rapids)").
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "cpu/simd/bf16_kernels.h"
#include "sdpa/sdpa.h"

namespace {

double seconds(bool cpu_time) {
  timespec t;
  clock_gettime(cpu_time ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

sdpa::Tensor random_tensor(sdpa::DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-0.5, 0.5);
  sdpa::Tensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, uniform(rng));
  return t;
}

// The whole of `text` as a whole number in [low, high], or a message naming `name`.
std::int64_t parse(const char* text, const char* name, std::int64_t low, std::int64_t high) {
  std::int64_t value = 0;
  const std::string_view view(text);
  const auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (error != std::errc() || end != view.data() + view.size() || value < low || value > high)
    throw std::invalid_argument(std::string(name) + ": expected a whole number in [" + std::to_string(low) + ", " +
                                std::to_string(high) + "], got '" + text + "'");
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9 || argc > 12) {
    std::fprintf(stderr, "usage: %s B Hq Hkv L S E causal calls [threads=1] [backward=0] [dtype=float32]\n", argv[0]);
    return 2;
  }
  try {
    constexpr std::int64_t kMax = std::int64_t{1} << 40;
    const std::int64_t B = parse(argv[1], "B", 0, kMax), Hq = parse(argv[2], "Hq", 0, kMax),
                       Hkv = parse(argv[3], "Hkv", 0, kMax), L = parse(argv[4], "L", 0, kMax),
                       S = parse(argv[5], "S", 0, kMax), E = parse(argv[6], "E", 0, kMax);
    const bool causal = parse(argv[7], "causal", 0, 1) != 0;
    const std::int64_t calls = parse(argv[8], "calls", 1, kMax);
    const int threads = argc > 9 ? static_cast<int>(parse(argv[9], "threads", 0, 4096)) : 1;
    const bool backward = argc > 10 && parse(argv[10], "backward", 0, 1) != 0;
    const std::string_view kind = argc > 11 ? argv[11] : "float32";
    const bool int8_kv = kind == "int8-kv";
    sdpa::DType dtype = sdpa::DType::bfloat16;
    if (kind == "float32")
      dtype = sdpa::DType::float32;
    else if (kind == "float16")
      dtype = sdpa::DType::float16;
    else if (kind != "bfloat16" && !int8_kv)
      throw std::invalid_argument("dtype: expected float32, bfloat16, float16 or int8-kv, got '" + std::string(kind) +
                                  "'");
    if (int8_kv && backward) throw std::invalid_argument("dtype: int8-kv has no backward");
    if (const char* forced = std::getenv("SDPA_AB_BFLOAT16")) {
      const std::string_view path = forced;
      if (path != "vdpbf16ps" && path != "widened")
        throw std::invalid_argument("SDPA_AB_BFLOAT16: expected vdpbf16ps or widened, got '" + std::string(path) + "'");
      if (path == "vdpbf16ps" && !sdpa::detail::bf16::supported())
        throw std::invalid_argument("SDPA_AB_BFLOAT16: this CPU has no vdpbf16ps");
      sdpa::detail::bf16::choose_for_test(path == "vdpbf16ps");
    }
    std::mt19937_64 rng(1);
    const sdpa::Tensor q = random_tensor(dtype, {B, Hq, L, E}, rng),
                       grad_output = random_tensor(dtype, {B, Hq, L, E}, rng);
    sdpa::Tensor k = random_tensor(dtype, {B, Hkv, S, E}, rng), v = random_tensor(dtype, {B, Hkv, S, E}, rng);
    sdpa::Tensor out(dtype, {B, Hq, L, E}), lse(sdpa::DType::float32, {B, Hq, L}), dq(dtype, {B, Hq, L, E}),
        dk(dtype, {B, Hkv, S, E}), dv(dtype, {B, Hkv, S, E});
    sdpa::Options options;
    sdpa::QuantizedKV k8, v8;
    if (int8_kv) {
      k8 = sdpa::quantize_kv(k.view());
      v8 = sdpa::quantize_kv(v.view());
      k = std::move(k8.values);
      v = std::move(v8.values);
      options.key_scale = k8.scale.view();
      options.value_scale = v8.scale.view();
    }
    options.num_threads = threads;
    if (causal) options.causal = sdpa::Causal::bottom_right;
    sdpa::forward(q.view(), k.view(), v.view(), {out.view(), {}, lse.view()}, options);
    const bool cpu_time = threads == 1;
    double best = 1e300;
    for (std::int64_t call = 0; call < calls; ++call) {
      const double start = seconds(cpu_time);
      if (backward)
        sdpa::backward({q.view(), k.view(), v.view(), out.view(), lse.view(), grad_output.view()},
                       {dq.view(), dk.view(), dv.view()}, options);
      else
        sdpa::forward(q.view(), k.view(), v.view(), {out.view(), {}, {}}, options);
      best = std::min(best, seconds(cpu_time) - start);
    }
    const auto d = [](std::int64_t x) { return static_cast<double>(x); };
    if (L == 1 && !backward) {
      const double row_bytes = int8_kv ? d(E) + 4.0 : d(E) * (dtype == sdpa::DType::float32 ? 4.0 : 2.0);
      std::printf("%.2f GB/s  best %.3f ms\n", 2.0 * d(B) * d(Hkv) * d(S) * row_bytes / best * 1e-9, best * 1e3);
    } else
      std::printf("%.1f GFLOP/s  best %.3f ms\n",
                  4.0 * d(B) * d(Hq) * d(L) * d(S) * d(E) * (causal ? 0.5 : 1.0) * (backward ? 2.5 : 1.0) / best * 1e-9,
                  best * 1e3);
  } catch (const std::exception& e) {  // sdpa::Error (a bad shape), a bad argument, no memory
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
