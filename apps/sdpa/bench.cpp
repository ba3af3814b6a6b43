// `sdpa bench`: the forward over the benchmark grid of issue #4, with the machine's
// peaks measured in the same run. FLOPs as FlashAttention counts them: 4·B·Hq·L·S·E
// (E = Ev), half of that when causal with L = S. Decode (L = 1) is memory-bound: its
// figure is GB/s of K and V read, against a streaming-read probe.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "commands.h"
#include "probes.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {

namespace {

struct Point {
  DType dtype;
  std::int64_t heads_q, heads_kv, L, S, E;
  bool causal;
  bool decode() const { return L <= 16; }
  std::string name() const {
    return std::string(dtype_name(dtype)) + " Hq=" + std::to_string(heads_q) + " Hkv=" + std::to_string(heads_kv) +
           " L=" + std::to_string(L) + " S=" + std::to_string(S) + " E=" + std::to_string(E) +
           (causal ? " causal" : "");
  }
  double flops() const { return 4.0 * heads_q * L * S * E * (causal && L == S ? 0.5 : 1.0); }
  double kv_bytes() const { return 2.0 * heads_kv * S * E * static_cast<double>(dtype_size(dtype)); }
};

std::vector<Point> grid(bool quick) {
  std::vector<Point> points;
  const std::vector<std::int64_t> lengths = quick ? std::vector<std::int64_t>{512, 2048}
                                                  : std::vector<std::int64_t>{512, 2048, 8192};
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (std::int64_t heads_kv : {16, 4})
      for (std::int64_t L : lengths)
        for (std::int64_t E : {64, 128})
          for (bool causal : {false, true}) points.push_back({dtype, 16, heads_kv, L, L, E, causal});
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (std::int64_t S : {4096, 65536}) points.push_back({dtype, 32, 8, 1, S, 128, false});
  return points;
}

Tensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  Tensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

// Median seconds of `repeats` calls after one warm-up call.
double time_point(const Point& p, int repeats, int threads) {
  std::mt19937_64 rng(1);
  const Tensor q = random_tensor(p.dtype, {1, p.heads_q, p.L, p.E}, rng);
  const Tensor k = random_tensor(p.dtype, {1, p.heads_kv, p.S, p.E}, rng);
  const Tensor v = random_tensor(p.dtype, {1, p.heads_kv, p.S, p.E}, rng);
  Tensor out(p.dtype, {1, p.heads_q, p.L, p.E});
  Options options;
  options.causal = p.causal ? Causal::top_left : Causal::none;
  options.num_threads = threads;
  const ForwardOutputs outputs{out.view(), std::nullopt, std::nullopt};
  forward(q.view(), k.view(), v.view(), outputs, options);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    forward(q.view(), k.view(), v.view(), outputs, options);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Training: median seconds of the forward (with lse) and of the backward, timed in the
// same runs, and of their sum.
struct TrainingSeconds {
  double forward, backward, both;
};
TrainingSeconds time_training(const Point& p, int repeats, int threads) {
  std::mt19937_64 rng(1);
  const Tensor q = random_tensor(p.dtype, {1, p.heads_q, p.L, p.E}, rng);
  const Tensor k = random_tensor(p.dtype, {1, p.heads_kv, p.S, p.E}, rng);
  const Tensor v = random_tensor(p.dtype, {1, p.heads_kv, p.S, p.E}, rng);
  const Tensor dout = random_tensor(p.dtype, {1, p.heads_q, p.L, p.E}, rng);
  Tensor out(p.dtype, {1, p.heads_q, p.L, p.E}), lse(DType::float32, {1, p.heads_q, p.L});
  Tensor dq(p.dtype, q.shape()), dk(p.dtype, k.shape()), dv(p.dtype, v.shape());
  Options options;
  options.causal = p.causal ? Causal::top_left : Causal::none;
  options.num_threads = threads;
  const ForwardOutputs outputs{out.view(), std::nullopt, lse.view()};
  const BackwardInputs inputs{q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view()};
  const BackwardOutputs grads{dq.view(), dk.view(), dv.view(), std::nullopt};
  std::vector<double> f, b, both;
  for (int r = 0; r <= repeats; ++r) {  // the first run warms up
    const auto start = std::chrono::steady_clock::now();
    forward(q.view(), k.view(), v.view(), outputs, options);
    const auto middle = std::chrono::steady_clock::now();
    backward(inputs, grads, options);
    const auto end = std::chrono::steady_clock::now();
    if (r == 0) continue;
    f.push_back(std::chrono::duration<double>(middle - start).count());
    b.push_back(std::chrono::duration<double>(end - middle).count());
    both.push_back(std::chrono::duration<double>(end - start).count());
  }
  for (auto* x : {&f, &b, &both}) std::sort(x->begin(), x->end());
  return {f[f.size() / 2], b[b.size() / 2], both[both.size() / 2]};
}

void progress(std::size_t done, std::size_t total, const std::string& what) {
  const int width = 30;
  const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-50s", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace

int bench_command(const BenchArgs& args) {
  const RuntimeInfo info = runtime_info();
  const int threads = args.threads > 0 ? args.threads : info.max_threads;
  progress(0, 1, "probing the machine");
  const bench::Probe fma = bench::fma_peak(threads);
  const bench::Probe bf16 = bench::bf16_dot_peak(threads);
  const bench::Probe stream = bench::stream_read(threads);

  nlohmann::json report;
  report["machine"] = {{"cpu_features", info.cpu_features}, {"kernel", info.cpu_kernel}, {"threads", threads},
                       {"fma_peak_gflops", fma.rate},        {"bf16_dot_peak_gflops", bf16.rate},
                       {"stream_read_gbs", stream.rate}};
  std::vector<Point> points = grid(args.quick);
  if (!args.filter.empty())
    std::erase_if(points, [&](const Point& p) { return p.name().find(args.filter) == std::string::npos; });
  if (args.backward) std::erase_if(points, [](const Point& p) { return p.decode(); });  // training shapes only
  std::vector<std::string> lines;
  for (std::size_t n = 0; n < points.size(); ++n) {
    const Point& p = points[n];
    progress(n, points.size(), p.name());
    if (args.backward) {
      // FLOPs: the forward's count, the backward 2.5 times it (FlashAttention).
      const TrainingSeconds t = time_training(p, args.repeats, threads);
      const double peak = p.dtype == DType::bfloat16 && bf16.rate > 0 ? bf16.rate : fma.rate;
      const double both = 3.5 * p.flops() / t.both / 1e9, back = 2.5 * p.flops() / t.backward / 1e9;
      report["points"].push_back({{"dtype", dtype_name(p.dtype)}, {"heads_q", p.heads_q}, {"heads_kv", p.heads_kv},
                                  {"L", p.L}, {"S", p.S}, {"E", p.E}, {"causal", p.causal},
                                  {"forward_seconds", t.forward}, {"backward_seconds", t.backward},
                                  {"forward_backward_seconds", t.both}, {"forward_backward_gflops", both},
                                  {"backward_gflops", back}, {"backward_fraction_of_fma_peak", back / fma.rate},
                                  {"forward_backward_fraction_of_peak", both / peak}});
      char line[240];
      std::snprintf(line, sizeof line,
                    "%-48s fwd+bwd %9.3f ms %7.1f GFLOP/s | bwd %9.3f ms %7.1f GFLOP/s %5.1f%% of FMA peak",
                    p.name().c_str(), t.both * 1e3, both, t.backward * 1e3, back, 100 * back / fma.rate);
      lines.emplace_back(line);
      continue;
    }
    const double seconds = time_point(p, args.repeats, threads);
    nlohmann::json row = {{"dtype", dtype_name(p.dtype)}, {"heads_q", p.heads_q}, {"heads_kv", p.heads_kv},
                          {"L", p.L},  {"S", p.S}, {"E", p.E}, {"causal", p.causal}, {"seconds", seconds}};
    char line[200];
    if (p.decode()) {
      const double gbs = p.kv_bytes() / seconds / 1e9;
      row["gbs"] = gbs;
      row["fraction_of_stream"] = gbs / stream.rate;
      std::snprintf(line, sizeof line, "%-48s %9.3f ms %8.1f GB/s   %5.1f%% of stream", p.name().c_str(),
                    seconds * 1e3, gbs, 100 * gbs / stream.rate);
    } else {
      const double gflops = p.flops() / seconds / 1e9;
      const double peak = p.dtype == DType::bfloat16 && bf16.rate > 0 ? bf16.rate : fma.rate;
      row["gflops"] = gflops;
      row["fraction_of_peak"] = gflops / peak;
      std::snprintf(line, sizeof line, "%-48s %9.3f ms %8.1f GFLOP/s %5.1f%% of %s peak", p.name().c_str(),
                    seconds * 1e3, gflops, 100 * gflops / peak,
                    p.dtype == DType::bfloat16 && bf16.rate > 0 ? "vdpbf16ps" : "FMA");
    }
    report["points"].push_back(row);
    lines.emplace_back(line);
  }
  progress(points.size(), points.size(), "done");

  if (args.json) {
    std::cout << report.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("sdpa %s, kernel %s, %d threads\n", info.version.c_str(), info.cpu_kernel.c_str(), threads);
  std::printf("probes: FMA %.1f GFLOP/s (%s), vdpbf16ps %.1f GFLOP/s, stream read %.1f GB/s\n", fma.rate, fma.what,
              bf16.rate, stream.rate);
  std::printf("median of %d runs, B = 1, E = Ev\n", args.repeats);
  if (args.backward) std::printf("forward + backward: backward counted as 2.5x the forward's FLOPs\n");
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  return kExitOk;
}

}  // namespace sdpa::cli
