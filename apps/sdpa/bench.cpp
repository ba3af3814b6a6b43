// `sdpa bench`: the forward over the benchmark grid of issue #4, with the machine's
// peaks measured in the same run. FLOPs as FlashAttention counts them: 4·B·Hq·L·S·E
// (E = Ev), half of that when causal with L = S. Decode (L = 1) reads each K and V
// element once: its figure is GB/s of K and V read, against a streaming-read probe. `--features` times the
// issue #7 features against the calls they replace (same results, less work).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
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
  std::int64_t batch = 1;
  // Quantized K/V (issue #15 item 5): int8 with a float32 scale per (token, head), the
  // query in `dtype`.
  bool int8_kv = false;
  // A few new tokens against a long cache: measured in GB/s of K and V read. With L > 1 the
  // new tokens are causal, bottom-right aligned (each sees the cache and the tokens before it).
  bool decode() const { return L <= 16 && S >= 4096; }
  Causal alignment() const {
    if (decode()) return L > 1 ? Causal::bottom_right : Causal::none;
    return causal ? Causal::top_left : Causal::none;
  }
  std::string name() const {
    return std::string(dtype_name(dtype)) + (int8_kv ? " int8-KV" : "") +
           (batch != 1 ? " B=" + std::to_string(batch) : "") +
           " Hq=" + std::to_string(heads_q) + " Hkv=" + std::to_string(heads_kv) + " L=" + std::to_string(L) +
           " S=" + std::to_string(S) + " E=" + std::to_string(E) + (alignment() != Causal::none ? " causal" : "");
  }
  // FlashAttention's count: half of L·S when causal with L = S; otherwise the (query, key)
  // pairs the mask leaves, summed over the rows (a few new tokens, bottom-right: L·S −
  // L(L−1)/2 when S >= L).
  double flops() const {
    double pairs = static_cast<double>(L) * static_cast<double>(S);
    if (alignment() != Causal::none && L == S) {
      pairs *= 0.5;
    } else if (alignment() != Causal::none) {
      const std::int64_t shift = alignment() == Causal::bottom_right ? S - L : 0;  // row i sees keys j <= i + shift
      pairs = 0;
      for (std::int64_t i = 0; i < L; ++i) pairs += static_cast<double>(std::clamp<std::int64_t>(i + shift + 1, 0, S));
    }
    return 4.0 * batch * heads_q * pairs * E;
  }
  // K and V read once; int8 K/V also read a float32 scale per row.
  double kv_bytes() const {
    const double row = int8_kv ? static_cast<double>(E) + 4.0 : static_cast<double>(E * dtype_size(dtype));
    return 2.0 * batch * heads_kv * S * row;
  }
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
  // int8 K/V beside the bfloat16 decode points above: the same shapes, half the bytes.
  for (std::int64_t S : {4096, 65536}) points.push_back({DType::bfloat16, 32, 8, 1, S, 128, false, 1, true});
  return points;
}

// `--small`: where a call's fixed cost shows (issue #15) — a model's small heads (H = 12,
// E = 64, L = S <= 128, B = 1 or 8) and batched decoding (L = 1-16 new tokens against
// S = 4096-65536, GQA 32/8, E = 128; float32, and bfloat16 for three). bench/peers.py
// times the same points from Python.
std::vector<Point> small_grid() {
  std::vector<Point> points;
  struct Small {
    std::int64_t batch, L;
    bool causal;
  };
  for (const Small& s : {Small{1, 16, false}, Small{1, 32, false}, Small{1, 64, false}, Small{1, 128, false},
                         Small{1, 128, true}, Small{8, 64, false}, Small{8, 128, false}})
    points.push_back({DType::float32, 12, 12, s.L, s.L, 64, s.causal, s.batch});
  struct Decode {
    std::int64_t batch, L, S;
  };
  for (const Decode& d : {Decode{1, 1, 4096}, Decode{1, 1, 65536}, Decode{4, 1, 16384}, Decode{16, 1, 4096},
                          Decode{1, 4, 32768}, Decode{1, 16, 8192}, Decode{4, 1, 65536}})
    points.push_back({DType::float32, 32, 8, d.L, d.S, 128, false, d.batch});
  for (const Decode& d : {Decode{1, 1, 65536}, Decode{16, 1, 4096}, Decode{1, 1, 8192}})  // bfloat16 caches
    points.push_back({DType::bfloat16, 32, 8, d.L, d.S, 128, false, d.batch});
  return points;
}

Tensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  Tensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

// A point's median seconds per call over `repeats` runs after one warm-up call (a run: a
// block of calls lasting about a millisecond, so that a call of microseconds is not timed
// alone); with `beside`, also the median over the runs of the run's K/V GB/s over a
// stream read timed just before it (the read evicts the caches, so a call after it
// warms them again, as the first warm-up did).
struct PointTiming {
  double seconds = 0;
  double fraction_beside = 0;  // 0 without `beside`
};
PointTiming time_point(const Point& p, int repeats, int threads, bench::StreamReader* beside) {
  std::mt19937_64 rng(1);
  const Tensor q = random_tensor(p.dtype, {p.batch, p.heads_q, p.L, p.E}, rng);
  Tensor k = random_tensor(p.dtype, {p.batch, p.heads_kv, p.S, p.E}, rng);
  Tensor v = random_tensor(p.dtype, {p.batch, p.heads_kv, p.S, p.E}, rng);
  Tensor out(p.dtype, {p.batch, p.heads_q, p.L, p.E});
  Options options;
  options.causal = p.alignment();
  options.num_threads = threads;
  QuantizedKV k8, v8;
  if (p.int8_kv) {
    k8 = quantize_kv(k.view());
    v8 = quantize_kv(v.view());
    k = std::move(k8.values);
    v = std::move(v8.values);
    options.key_scale = k8.scale.view();
    options.value_scale = v8.scale.view();
  }
  const ForwardOutputs outputs{out.view(), std::nullopt, std::nullopt};
  auto block = [&](int calls) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) forward(q.view(), k.view(), v.view(), outputs, options);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
  };
  const double warm = std::min(block(1), block(1));
  const int calls = static_cast<int>(std::clamp(1e-3 / warm, 1.0, 1e5));
  std::vector<double> seconds, fractions;
  for (int r = 0; r < repeats; ++r) {
    const double stream = beside != nullptr ? beside->read_gbs() : 0;
    if (beside != nullptr) block(1);
    seconds.push_back(block(calls));
    if (stream > 0) fractions.push_back(p.kv_bytes() / seconds.back() / 1e9 / stream);
  }
  const auto median = [](std::vector<double>& x) {
    std::sort(x.begin(), x.end());
    return x.empty() ? 0.0 : x[x.size() / 2];
  };
  return {median(seconds), median(fractions)};
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
  options.causal = p.alignment();
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

// Median seconds of `repeats` calls after one warm-up call.
double median_seconds(int repeats, const std::function<void()>& call) {
  call();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    call();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// A feature's call against the call it replaces (which gives the same results with
// more work), timed alternately in the same run.
struct Comparison {
  std::string name, baseline;
  std::function<void()> call, baseline_call;
  double seconds = 0, baseline_seconds = 0;
};

// One attention problem's tensors and a forward (and backward) over them, as a closure.
struct Case {
  Tensor q, k, v, out, lse, dout, dq, dk, dv, mask, slopes;  // mask, slopes: when options use them
  Options options;
  Case(DType dtype, std::vector<std::int64_t> q_shape, std::vector<std::int64_t> kv_shape, Options opts,
       std::mt19937_64& rng)
      : q(random_tensor(dtype, q_shape, rng)),
        k(random_tensor(dtype, kv_shape, rng)),
        v(random_tensor(dtype, kv_shape, rng)),
        out(dtype, q_shape),
        dout(random_tensor(dtype, q_shape, rng)),
        dq(dtype, q_shape),
        dk(dtype, kv_shape),
        dv(dtype, kv_shape),
        options(std::move(opts)) {
    q_shape.pop_back();
    lse = Tensor(DType::float32, q_shape);
  }
  ForwardOutputs outputs() const { return {out.view(), std::nullopt, lse.view()}; }
  BackwardInputs backward_inputs() const {
    return {q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view()};
  }
  BackwardOutputs gradients() const { return {dq.view(), dk.view(), dv.view(), std::nullopt}; }
  void forward_call() const { forward(q.view(), k.view(), v.view(), outputs(), options); }
  void training_call() const {
    forward_call();
    backward(backward_inputs(), gradients(), options);
  }
};

// The comparisons of `sdpa bench --features`; with `training`, forward + backward where
// FlashAttention has a backward (window, varlen, ALiBi, softcap).
std::vector<Comparison> feature_comparisons(bool training, int threads) {
  std::mt19937_64 rng(7);
  std::vector<Comparison> list;
  auto options = [&](auto&& set) {
    Options o;
    o.num_threads = threads;
    set(o);
    return o;
  };
  auto timed = [training](const std::shared_ptr<Case>& c) {
    return training ? std::function<void()>([c] { c->training_call(); }) : std::function<void()>([c] { c->forward_call(); });
  };

  // Sliding window at L = S = 8192 (Mistral's local causal attention and a symmetric
  // window) against full attention.
  const std::int64_t H = 4, N = 8192, E = 64;
  auto full = std::make_shared<Case>(DType::float32, std::vector<std::int64_t>{1, H, N, E},
                                     std::vector<std::int64_t>{1, H, N, E}, options([](Options&) {}), rng);
  const std::string shape = "float32 H=4 L=S=8192 E=64";
  auto window_case = [&](std::int64_t left, std::int64_t right, Causal causal) {
    auto c = std::make_shared<Case>(*full);
    c->options.window_left = left;
    c->options.window_right = right;
    c->options.causal = causal;
    return c;
  };
  auto causal = window_case(-1, -1, Causal::bottom_right);
  auto local = window_case(256, 0, Causal::bottom_right);
  auto band = window_case(256, 256, Causal::none);
  list.push_back({"causal " + shape, "full", timed(causal), timed(full)});
  list.push_back({"window (256, 0) causal " + shape, "full", timed(local), timed(full)});
  list.push_back({"window (256, 256) " + shape, "full", timed(band), timed(full)});

  // Varlen: 8 sequences of up to 2048 tokens, half the padded batch's tokens, against
  // the padded batch with a key-padding mask (the same results on the real rows).
  {
    const std::vector<std::int64_t> lengths{2048, 1792, 1280, 1024, 768, 512, 256, 512};
    const std::int64_t B = 8, Lmax = 2048, Hv = 8;
    auto padded = std::make_shared<Case>(DType::float32, std::vector<std::int64_t>{B, Hv, Lmax, E},
                                         std::vector<std::int64_t>{B, Hv, Lmax, E}, options([](Options&) {}), rng);
    padded->mask = Tensor(DType::boolean, {B, 1, 1, Lmax});
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < lengths[static_cast<std::size_t>(b)]; ++j) padded->mask.set(b * Lmax + j, 1.0);
    padded->options.mask = padded->mask.view();
    std::int64_t total = 0;
    VarlenSequences sequences{{0}, {0}};
    for (std::int64_t length : lengths) {
      total += length;
      sequences.cu_seqlens_q.push_back(total);
      sequences.cu_seqlens_k.push_back(total);
    }
    auto packed = std::make_shared<Case>(DType::float32, std::vector<std::int64_t>{Hv, total, E},
                                         std::vector<std::int64_t>{Hv, total, E}, options([](Options&) {}), rng);
    std::function<void()> varlen = [packed, sequences, training] {
      forward_varlen(packed->q.view(), packed->k.view(), packed->v.view(), sequences, packed->outputs(),
                     packed->options);
      if (training) backward_varlen(packed->backward_inputs(), sequences, packed->gradients(), packed->options);
    };
    list.push_back({"varlen 8 seqs (half padding) float32 H=8 Lmax=2048 E=64", "padded batch + mask", varlen,
                    timed(padded)});
  }

  // Paged decoding: 8 sequences of 4096 keys in shuffled 16-row pages, against the same
  // keys held contiguously. Forward only (decoding).
  if (!training) {
    const std::int64_t B = 8, Hq = 32, Hkv = 8, S = 4096, Ev = 128, page = 16, blocks = S / page;
    auto contiguous = std::make_shared<Case>(DType::float32, std::vector<std::int64_t>{B, Hq, 1, Ev},
                                             std::vector<std::int64_t>{B, Hkv, S, Ev}, options([](Options&) {}), rng);
    auto pages = std::make_shared<std::pair<Tensor, Tensor>>(random_tensor(DType::float32, {B * blocks, Hkv, page, Ev}, rng),
                                                             random_tensor(DType::float32, {B * blocks, Hkv, page, Ev}, rng));
    auto cache = std::make_shared<PagedKV>();
    cache->key_pages = pages->first.view();
    cache->value_pages = pages->second.view();
    cache->blocks_per_sequence = blocks;
    cache->seq_lens.assign(static_cast<std::size_t>(B), S);
    for (std::int64_t i = 0; i < B * blocks; ++i) cache->block_table.push_back((i * 7919) % (B * blocks));  // shuffled
    std::function<void()> paged = [contiguous, pages, cache] {
      forward_paged(contiguous->q.view(), *cache, contiguous->outputs(), contiguous->options);
    };
    list.push_back({"paged decode float32 B=8 Hq=32 Hkv=8 S=4096 E=128 page=16", "contiguous", paged,
                    timed(contiguous)});
  }

  // What ALiBi and softcapping add to a plain call.
  auto plain = std::make_shared<Case>(DType::float32, std::vector<std::int64_t>{1, 16, 2048, E},
                                      std::vector<std::int64_t>{1, 16, 2048, E}, options([](Options&) {}), rng);
  auto alibi = std::make_shared<Case>(*plain);
  alibi->slopes = Tensor(DType::float32, {16});
  for (std::int64_t h = 0; h < 16; ++h) alibi->slopes.set(h, std::exp2(-0.5 * static_cast<double>(h + 1)));  // ALiBi's
  alibi->options.alibi_slopes = alibi->slopes.view();
  auto softcap = std::make_shared<Case>(*plain);
  softcap->options.softcap = 30.0;
  list.push_back({"ALiBi float32 H=16 L=S=2048 E=64", "plain", timed(alibi), timed(plain)});
  list.push_back({"softcap 30 float32 H=16 L=S=2048 E=64", "plain", timed(softcap), timed(plain)});
  return list;
}

int features_command(const BenchArgs& args, int threads, nlohmann::json& report) {
  std::vector<Comparison> list = feature_comparisons(args.backward, threads);
  for (std::size_t n = 0; n < list.size(); ++n) {
    progress(n, list.size(), list[n].name);
    // Alternate the two so that drift in the machine's speed hits both alike.
    std::vector<double> a, b;
    for (int round = 0; round < 2; ++round) {
      a.push_back(median_seconds(args.repeats, list[n].call));
      b.push_back(median_seconds(args.repeats, list[n].baseline_call));
    }
    list[n].seconds = std::min(a[0], a[1]);
    list[n].baseline_seconds = std::min(b[0], b[1]);
  }
  progress(list.size(), list.size(), "done");
  for (const Comparison& c : list)
    report["features"].push_back({{"name", c.name}, {"baseline", c.baseline}, {"seconds", c.seconds},
                                  {"baseline_seconds", c.baseline_seconds},
                                  {"speedup", c.baseline_seconds / c.seconds}});
  if (args.json) {
    std::cout << report.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("%s; best of 2 alternating medians of %d runs; same results as the baseline, less work\n",
              args.backward ? "forward + backward" : "forward", args.repeats);
  for (const Comparison& c : list)
    std::printf("%-58s %9.3f ms  vs %-20s %9.3f ms  %6.2fx\n", c.name.c_str(), c.seconds * 1e3, c.baseline.c_str(),
                c.baseline_seconds * 1e3, c.baseline_seconds / c.seconds);
  return kExitOk;
}

// The machine's probes, measured before the grid and again after it, each the better of
// the two: a VM's neighbours can slow a probe's second for a while, and a low probe would
// inflate every fraction quoted against it (the vdpbf16ps probe has read 309 and 462
// GFLOP/s minutes apart on the Zen 4 of bench/RESULTS.md).
struct Probes {
  bench::Probe fma, bf16, stream;
};
Probes probe_machine(int threads, bench::StreamReader& reader, const Probes* before = nullptr) {
  Probes now{bench::fma_peak(threads), bench::bf16_dot_peak(threads), bench::stream_read(reader)};
  if (before) {
    for (auto member : {&Probes::fma, &Probes::bf16, &Probes::stream})
      if ((before->*member).rate > (now.*member).rate) now.*member = before->*member;
  }
  return now;
}

}  // namespace

int bench_command(const BenchArgs& args) {
  const RuntimeInfo info = runtime_info();
  const int threads = args.threads > 0 ? args.threads : info.max_threads;
  progress(0, 1, "probing the machine");
  // The stream probe's buffer, also read beside each decode run (time_point).
  bench::StreamReader reader(threads);
  Probes probes = probe_machine(threads, reader);

  nlohmann::json report;
  const auto describe_machine = [&] {
    report["machine"] = {{"cpu_features", info.cpu_features},
                         {"kernel", info.cpu_kernel},
                         {"threads", threads},
                         {"fma_peak_gflops", probes.fma.rate},
                         {"bf16_dot_peak_gflops", probes.bf16.rate},
                         {"stream_read_gbs", probes.stream.rate},
                         {"bfloat16_on_vdpbf16ps", info.bfloat16_on_vdpbf16ps}};
  };
  describe_machine();
  if (args.features) return features_command(args, threads, report);
  std::vector<Point> points = args.small ? small_grid() : grid(args.quick);
  if (!args.filter.empty())
    std::erase_if(points, [&](const Point& p) { return p.name().find(args.filter) == std::string::npos; });
  if (args.backward) std::erase_if(points, [](const Point& p) { return p.decode(); });  // training shapes only
  const bool decoding = std::any_of(points.begin(), points.end(), [](const Point& p) { return p.decode(); });
  // The timings first, the fractions once the probes are measured again.
  std::vector<TrainingSeconds> training(points.size());
  std::vector<PointTiming> timings(points.size());
  for (std::size_t n = 0; n < points.size(); ++n) {
    progress(n, points.size(), points[n].name());
    if (args.backward)
      training[n] = time_training(points[n], args.repeats, threads);
    else
      timings[n] =
          time_point(points[n], args.repeats, threads, points[n].decode() && reader.ready() ? &reader : nullptr);
  }
  progress(points.size(), points.size(), "probing the machine again");
  probes = probe_machine(threads, reader, &probes);
  describe_machine();
  const bench::Probe &fma = probes.fma, &bf16 = probes.bf16, &stream = probes.stream;
  // A bfloat16 point is quoted against the probe of the arithmetic it runs on (forward
  // and backward): vdpbf16ps where the library takes it, FMA where it widens.
  const auto on_vdpbf16ps = [&](const Point& p) {
    return p.dtype == DType::bfloat16 && info.bfloat16_on_vdpbf16ps && bf16.rate > 0;
  };

  std::vector<std::string> lines;
  for (std::size_t n = 0; n < points.size(); ++n) {
    const Point& p = points[n];
    if (args.backward) {
      // FLOPs: the forward's count, the backward 2.5 times it (FlashAttention).
      const TrainingSeconds& t = training[n];
      const double peak = on_vdpbf16ps(p) ? bf16.rate : fma.rate;
      const double both = 3.5 * p.flops() / t.both / 1e9, back = 2.5 * p.flops() / t.backward / 1e9;
      report["points"].push_back({{"dtype", dtype_name(p.dtype)}, {"heads_q", p.heads_q}, {"heads_kv", p.heads_kv},
                                  {"L", p.L}, {"S", p.S}, {"E", p.E}, {"causal", p.causal},
                                  {"forward_seconds", t.forward}, {"backward_seconds", t.backward},
                                  {"forward_backward_seconds", t.both}, {"forward_backward_gflops", both},
                                  {"backward_gflops", back}, {"backward_fraction_of_peak", back / peak},
                                  {"forward_backward_fraction_of_peak", both / peak}});
      char line[240];
      std::snprintf(line, sizeof line,
                    "%-48s fwd+bwd %9.3f ms %7.1f GFLOP/s | bwd %9.3f ms %7.1f GFLOP/s %5.1f%% of %s peak",
                    p.name().c_str(), t.both * 1e3, both, t.backward * 1e3, back, 100 * back / peak,
                    on_vdpbf16ps(p) ? "vdpbf16ps" : "FMA");
      lines.emplace_back(line);
      continue;
    }
    const double seconds = timings[n].seconds;
    nlohmann::json row = {{"dtype", dtype_name(p.dtype)}, {"batch", p.batch}, {"heads_q", p.heads_q},
                          {"heads_kv", p.heads_kv}, {"L", p.L}, {"S", p.S}, {"E", p.E},
                          {"causal", p.alignment() != Causal::none}, {"int8_kv", p.int8_kv}, {"seconds", seconds}};
    char line[200];
    if (p.decode()) {
      const double gbs = p.kv_bytes() / seconds / 1e9, beside = timings[n].fraction_beside;
      row["gbs"] = gbs;
      row["fraction_of_stream"] = gbs / stream.rate;
      const int at = std::snprintf(line, sizeof line, "%-48s %9.3f ms %8.1f GB/s   %5.1f%% of stream", p.name().c_str(),
                                   seconds * 1e3, gbs, 100 * gbs / stream.rate);
      if (beside > 0 && at > 0 && at < static_cast<int>(sizeof line)) {  // (0: no memory for the reader's buffer)
        row["fraction_of_stream_beside"] = beside;
        std::snprintf(line + at, sizeof line - at, "  %5.1f%% of the read beside", 100 * beside);
      }
    } else {
      const double gflops = p.flops() / seconds / 1e9;
      const double peak = on_vdpbf16ps(p) ? bf16.rate : fma.rate;
      row["gflops"] = gflops;
      row["fraction_of_peak"] = gflops / peak;
      std::snprintf(line, sizeof line, "%-48s %9.3f ms %8.1f GFLOP/s %5.1f%% of %s peak", p.name().c_str(),
                    seconds * 1e3, gflops, 100 * gflops / peak, on_vdpbf16ps(p) ? "vdpbf16ps" : "FMA");
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
  std::printf(
      "probes (the better of before and after the grid): FMA %.1f GFLOP/s (%s), vdpbf16ps %.1f GFLOP/s%s, "
      "stream read %.1f GB/s\n",
      fma.rate, fma.what, bf16.rate,
      bf16.rate > 0 && !info.bfloat16_on_vdpbf16ps ? " (not taken here: bfloat16 is widened, % of FMA)" : "",
      stream.rate);
  std::printf("median of %d runs (a run: calls for about a millisecond, per call), B = 1 unless shown, E = Ev\n",
              args.repeats);
  if (decoding)
    std::printf(
        "decode: GB/s of K and V, as a fraction of the stream probe and (the median over the runs) of a stream "
        "read timed just before each run\n");
  if (args.backward) std::printf("forward + backward: backward counted as 2.5x the forward's FLOPs\n");
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  return kExitOk;
}

}  // namespace sdpa::cli
