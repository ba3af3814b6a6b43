// `sdpa demo`: seed 003's walkthrough on "the cat ate the rat", one step at a time as
// the seed writes it (embeddings, Q/K/V projections with Xavier initialisation, RoPE,
// scores, scaling, causal mask, softmax, output), each step computed literally in
// float64 and printed with its shape; then the same through the library (sdpa::forward
// on the CPU path against the float64 oracle, and sdpa::nn::MultiHeadAttention with a
// KV cache), seed 004's scaling experiment, and the pictures as PNG files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"
#include "io/output_files.h"
#include "plot.h"
#include "sdpa/nn.h"
#include "sdpa/sdpa.h"

namespace sdpa::cli {
namespace {

// Seed 003's sequence: 11 token ids for "the cat ate the rat" (its "Step0. Preparation"),
// with 'c' at position 2 and 'r' at position 9, seven positions apart as the seed says.
// Decoded with the vocabulary those ids imply (0 ' ', 2 'c', 3 'e', 6 'r', 7 'at',
// 9 'the'); the seed's list drops the space between "ate" and "the".
const std::vector<int> kTokens = {9, 0, 2, 7, 0, 7, 3, 9, 0, 6, 7};
const char* token_text(int id) {
  switch (id) {
    case 0:
      return " ";
    case 2:
      return "c";
    case 3:
      return "e";
    case 6:
      return "r";
    case 7:
      return "at";
    case 9:
      return "the";
    default:
      return "?";
  }
}
// Labels for the printed tables: a space would not show in a column of text.
std::string token_label(int id) { return id == 0 ? "_" : token_text(id); }
// Labels for the pictures: the open box (U+2423) that marks a space in type.
std::string picture_label(int id) { return id == 0 ? "\u2423" : token_text(id); }

constexpr std::int64_t kModel = 512;  // d_model, as in seed 003
constexpr std::int64_t kHead = 64;    // d_k = d_v, as in seed 003's scaling step
constexpr std::int64_t kVocab = 10;

using Matrix = std::vector<std::vector<double>>;

// A rows x cols matrix of N(0, σ²) values that depends on `seed` only: Philox through
// xavier_normal, whose σ is gain · sqrt(2 / (rows + cols)).
Matrix normal_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed, double sigma) {
  Tensor t(DType::float64, {rows, cols});
  nn::xavier_normal(t.view(), seed, sigma / std::sqrt(2.0 / static_cast<double>(rows + cols)));
  Matrix m(static_cast<std::size_t>(rows), std::vector<double>(static_cast<std::size_t>(cols)));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) m[i][j] = t.get(i * cols + j);
  return m;
}

Matrix matmul(const Matrix& a, const Matrix& b) {  // (n, k) · (k, m)
  Matrix c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < b.size(); ++k)
      for (std::size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

Matrix transpose(const Matrix& a) {
  Matrix t(a[0].size(), std::vector<double>(a.size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  return t;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Seed 003's R_i: the RoFormer block-diagonal rotation, pairs (2t, 2t+1) rotated by
// i · θ_t with θ_t = 10000^(−2t/d).
std::vector<double> rotate(const std::vector<double>& x, double position) {
  std::vector<double> y = x;
  const double d = static_cast<double>(x.size());
  for (std::size_t t = 0; 2 * t + 1 < x.size(); ++t) {
    const double angle = position * std::pow(10000.0, -2.0 * static_cast<double>(t) / d);
    y[2 * t] = x[2 * t] * std::cos(angle) - x[2 * t + 1] * std::sin(angle);
    y[2 * t + 1] = x[2 * t] * std::sin(angle) + x[2 * t + 1] * std::cos(angle);
  }
  return y;
}

// Row-wise softmax, stable form (seed 004): exp(x − max) / Σ exp(x − max).
Matrix softmax_rows(const Matrix& s) {
  Matrix p = s;
  for (auto& row : p) {
    const double m = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (double& v : row) sum += (v = std::exp(v - m));
    for (double& v : row) v /= sum;
  }
  return p;
}

void print_shape(const char* name, const Matrix& m, const char* note) {
  std::printf("  %-10s (%zu, %zu)  %s\n", name, m.size(), m[0].size(), note);
}

// Prints a matrix whose rows and columns are tokens; -inf as "-inf".
void print_token_matrix(const Matrix& m, const char* format) {
  std::printf("        ");
  for (int id : kTokens) std::printf("%7s", token_label(id).c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < m.size(); ++i) {
    std::printf("  %2zu %-3s", i, token_label(kTokens[i]).c_str());
    for (double v : m[i]) {
      if (std::isinf(v)) {
        std::printf("%7s", v < 0 ? "-inf" : "inf");
      } else {
        std::printf(format, v);
      }
    }
    std::printf("\n");
  }
}

void print_rows(const Matrix& m, std::size_t rows, std::size_t cols) {
  for (std::size_t i = 0; i < std::min(rows, m.size()); ++i) {
    std::printf("  %2zu %-3s [", i, token_label(kTokens[i]).c_str());
    for (std::size_t j = 0; j < std::min(cols, m[i].size()); ++j) std::printf("%8.4f", m[i][j]);
    std::printf("  ...]\n");
  }
  if (m.size() > rows) std::printf("  ...\n");
}

Tensor to_tensor(const Matrix& m, DType dtype) {
  Tensor t(dtype, {static_cast<std::int64_t>(m.size()), static_cast<std::int64_t>(m[0].size())});
  for (std::size_t i = 0; i < m.size(); ++i)
    for (std::size_t j = 0; j < m[0].size(); ++j) t.set(static_cast<std::int64_t>(i * m[0].size() + j), m[i][j]);
  return t;
}

double max_diff(const Tensor& a, const Matrix& b) {
  double worst = 0;
  const std::size_t cols = b[0].size();
  for (std::size_t i = 0; i < b.size(); ++i)
    for (std::size_t j = 0; j < cols; ++j)
      worst = std::max(worst, std::abs(a.get(static_cast<std::int64_t>(i * cols + j)) - b[i][j]));
  return worst;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) worst = std::max(worst, std::abs(a.get(i) - b.get(i)));
  return worst;
}

plot::Matrix plot_matrix(const Matrix& m) {
  plot::Matrix out{static_cast<std::int64_t>(m.size()), static_cast<std::int64_t>(m[0].size()), {}};
  for (const auto& row : m) out.values.insert(out.values.end(), row.begin(), row.end());
  return out;
}

// Each picture is written as any output is (io::write_file: atomically, never damaging
// what is there).
void write_picture(const std::string& path, const Picture& picture, std::vector<std::string>& written) {
  io::write_file(path, encode_png(picture, path));
  written.push_back(path);
}

}  // namespace

int demo_command(const DemoArgs& args) {
  bool ok = true;
  std::printf("sdpa %s: scaled dot-product attention, step by step (seed 003's walkthrough)\n\n", version());

  // ---- Step 0: tokens.
  const std::size_t n = kTokens.size();
  std::printf("Step 0. Tokens\n  text     \"the cat ate the rat\"\n  ids      [");
  for (std::size_t i = 0; i < n; ++i) std::printf("%s%d", i ? ", " : "", kTokens[i]);
  std::printf("]   (seed 003's sequence, %zu tokens)\n  tokens   ", n);
  for (int id : kTokens) std::printf("'%s' ", token_text(id));
  std::printf("\n  The seed follows the query of 'c' (position 2) and the key of 'r' (position 9).\n\n");

  // ---- Step 1: embeddings.
  const Matrix table = normal_matrix(kVocab, kModel, 1, 1.0);  // nn.Embedding's N(0, 1)
  Matrix x;
  for (int id : kTokens) x.push_back(table[static_cast<std::size_t>(id)]);
  std::printf("Step 1. Embeddings  X = E[ids], E ~ N(0, 1) (%lld x %lld table)\n", static_cast<long long>(kVocab),
              static_cast<long long>(kModel));
  print_shape("X", x, "one row per token, d_model = 512");
  print_rows(x, 3, 6);
  std::printf("\n");

  // ---- Step 2: projections, Xavier-normal weights N(0, 2 / (d_in + d_out)) (seed 003).
  const double xavier_sigma = std::sqrt(2.0 / static_cast<double>(kModel + kHead));
  const Matrix wq = normal_matrix(kModel, kHead, 2, xavier_sigma), wk = normal_matrix(kModel, kHead, 3, xavier_sigma),
               wv = normal_matrix(kModel, kHead, 4, xavier_sigma);
  const Matrix q = matmul(x, wq), k = matmul(x, wk), v = matmul(x, wv);
  std::printf("Step 2. Projections  Q = X W_q, K = X W_k, V = X W_v\n");
  std::printf("  W_q, W_k, W_v (512, 64), Xavier normal: N(0, 2 / (512 + 64)), sigma = %.4f\n", xavier_sigma);
  print_shape("Q", q, "what each token is looking for");
  print_shape("K", k, "what each token offers");
  print_shape("V", v, "what each token passes on");
  print_rows(q, 3, 6);
  std::printf("\n");

  // ---- Step 3: RoPE on Q and K (not V), positions 0 … 10.
  Matrix qr, kr;
  for (std::size_t i = 0; i < n; ++i) {
    qr.push_back(rotate(q[i], static_cast<double>(i)));
    kr.push_back(rotate(k[i], static_cast<double>(i)));
  }
  std::printf("Step 3. Rotary position embedding  q'_i = R_i q_i, k'_j = R_j k_j (pairs (2t, 2t+1), base 10000)\n");
  print_shape("Q'", qr, "rotated queries");
  print_shape("K'", kr, "rotated keys; V is not rotated");
  std::printf("  |q_2| = %.6f, |q'_2| = %.6f: a rotation keeps lengths\n", std::sqrt(dot(q[2], q[2])),
              std::sqrt(dot(qr[2], qr[2])));
  const double score_29 = dot(qr[2], kr[9]);
  const double shifted = dot(rotate(q[2], 2 + 5), rotate(k[9], 9 + 5));
  std::printf("  q'_2 . k'_9 = %.6f; both shifted 5 positions on: %.6f (depends on 9 - 2 = 7 only)\n\n", score_29,
              shifted);

  // ---- Step 4–7: scores, scaling, mask, softmax.
  const Matrix scores = matmul(qr, transpose(kr));
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHead));
  Matrix scaled = scores;
  for (auto& row : scaled)
    for (double& s : row) s *= scale;
  Matrix masked = scaled;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j) masked[i][j] = -INFINITY;
  const Matrix weights = softmax_rows(masked), weights_no_mask = softmax_rows(scaled);

  std::printf("Step 4. Scores  S = Q' K'^T\n");
  print_shape("S", scores, "S_ij = q'_i . k'_j");
  print_token_matrix(scores, "%7.1f");
  std::printf("\nStep 5. Scaling  S / sqrt(d_k) = S / %.0f (Var(q.k) grows like d_k; see seed 004 below)\n",
              std::sqrt(static_cast<double>(kHead)));
  std::printf("  'c' (2) against 'r' (9): %.3f / 8 = %.3f\n", scores[2][9], scaled[2][9]);
  print_token_matrix(scaled, "%7.2f");
  std::printf("\nStep 6. Causal mask  M_ij = 0 if j <= i, -inf if j > i\n");
  print_token_matrix(masked, "%7.2f");
  std::printf("\nStep 7. Softmax over each row  A = softmax(S / sqrt(d_k) + M)\n");
  print_shape("A", weights, "rows sum to 1; future keys get exactly 0");
  print_token_matrix(weights, "%7.3f");
  std::printf("  Under the causal mask 'c' (2) cannot see 'r' (9): weight %.3f. Without the mask: %.3f.\n",
              weights[2][9], weights_no_mask[2][9]);

  // ---- Step 8: output.
  const Matrix out = matmul(weights, v);
  std::printf("\nStep 8. Output  O = A V\n");
  print_shape("O", out, "each token's context-aware representation");
  print_rows(out, 3, 6);

  // ---- The same through the library.
  std::printf("\nThe same through the library\n");
  {
    const Tensor q64 = to_tensor(qr, DType::float64), k64 = to_tensor(kr, DType::float64),
                 v64 = to_tensor(v, DType::float64);
    const Tensor q32 = to_tensor(qr, DType::float32), k32 = to_tensor(kr, DType::float32),
                 v32 = to_tensor(v, DType::float32);
    Options options;
    options.causal = Causal::top_left;
    Options reference = options;
    reference.backend = Backend::reference;
    const ForwardResult oracle = forward(q64.view(), k64.view(), v64.view(), reference, Returns{true, false});
    const ForwardResult fast = forward(q32.view(), k32.view(), v32.view(), options, Returns{true, false});
    const double literal_error = std::max(max_diff(oracle.output, out), max_diff(oracle.weights, weights));
    const double out_error = max_diff(fast.output, oracle.output),
                 weights_error = max_diff(fast.weights, oracle.weights);
    const double out_scale = std::max(1.0, [&] {
      double m = 0;
      for (std::int64_t i = 0; i < oracle.output.numel(); ++i) m = std::max(m, std::abs(oracle.output.get(i)));
      return m;
    }());
    const bool close = out_error <= 1e-5 * out_scale && weights_error <= 1e-5;
    const bool literal_ok = literal_error <= 1e-10;
    ok = ok && close && literal_ok;
    std::printf("  sdpa::forward float64 oracle vs the steps above: max |difference| %.2e (%s)\n", literal_error,
                literal_ok ? "agree" : "DISAGREE");
    std::printf("  CPU vs float64 oracle: output max |error| %.2e, weights max |error| %.2e  (%s, tolerance 1e-5)\n",
                out_error, weights_error, close ? "agree" : "DISAGREE");
  }
  {
    // A whole layer: 8 heads of 64 over d_model 512, RoPE as above, Xavier normal.
    nn::MultiHeadAttentionConfig config;
    config.embed_dim = kModel;
    config.num_heads = 8;
    config.dtype = DType::float64;
    config.init = nn::Init::xavier_normal;
    config.rope = nn::RopeOptions{10000.0, nn::RopeLayout::interleaved, 0};
    config.seed = 3;
    const nn::MultiHeadAttention layer(config);
    Tensor xt(DType::float64, {1, static_cast<std::int64_t>(n), kModel});
    for (std::size_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < kModel; ++j) xt.set(static_cast<std::int64_t>(i) * kModel + j, x[i][j]);
    nn::AttentionCall causal_call;
    causal_call.causal = Causal::top_left;
    const nn::AttentionResult whole = layer.forward(xt.view(), causal_call);

    nn::KVCache cache = layer.make_cache(1);
    double decode_error = 0;
    for (std::size_t t = 0; t < n; ++t) {
      TensorView step = xt.view();
      step.data = static_cast<double*>(xt.data()) + t * kModel;
      step.shape = {1, 1, kModel};
      step.strides = {1, kModel, 1};
      nn::AttentionCall call;
      call.causal = Causal::top_left;
      call.cache = &cache;
      const nn::AttentionResult one = layer.forward(step, call);
      for (std::int64_t j = 0; j < kModel; ++j) {
        decode_error = std::max(decode_error, std::abs(one.output.get(j) - whole.output.get(t * kModel + j)));
      }
    }
    const bool decode_ok = decode_error <= 1e-10;
    ok = ok && decode_ok;
    std::printf("  nn::MultiHeadAttention (d_model 512, 8 heads, RoPE, causal): output (1, %zu, 512)\n", n);
    std::printf("  decoding token by token with a KV cache vs one causal pass: max |difference| %.2e (%s)\n",
                decode_error, decode_ok ? "agree" : "DISAGREE");
  }

  // ---- Seed 004: why sqrt(d_k).
  std::printf("\nSeed 004: why divide by sqrt(d_k)\n");
  std::vector<Picture> bars;
  for (std::int64_t dk : {8, 64, 512}) {
    // Var(q.k) over 1000 pairs of N(0, 1) vectors: theory says d_k.
    const Matrix qs = normal_matrix(1000, dk, 100 + dk, 1.0), ks = normal_matrix(1000, dk, 200 + dk, 1.0);
    double mean = 0, sq = 0;
    for (std::size_t i = 0; i < 1000; ++i) {
      const double d = dot(qs[i], ks[i]);
      mean += d, sq += d * d;
    }
    mean /= 1000;
    const double var = (sq - 1000 * mean * mean) / 999;
    // One query against 10 keys, softmax with and without the scale.
    const Matrix q1 = normal_matrix(1, dk, 500 + dk, 1.0), keys = normal_matrix(10, dk, 600 + dk, 1.0);
    Matrix unscaled(1), scaled_row(1);
    for (std::size_t j = 0; j < 10; ++j) {
      const double s = dot(q1[0], keys[j]);
      unscaled[0].push_back(s);
      scaled_row[0].push_back(s / std::sqrt(static_cast<double>(dk)));
    }
    const Matrix pu = softmax_rows(unscaled), ps = softmax_rows(scaled_row);
    std::printf("  d_k = %3lld: Var(q.k) = %6.1f (expected %lld); largest weight unscaled %.3f, scaled %.3f\n",
                static_cast<long long>(dk), var, static_cast<long long>(dk),
                *std::max_element(pu[0].begin(), pu[0].end()), *std::max_element(ps[0].begin(), ps[0].end()));
    char title[64], subtitle[96];
    std::snprintf(title, sizeof title, "d\u2096 = %lld", static_cast<long long>(dk));
    std::snprintf(subtitle, sizeof subtitle, "Var(q\u00b7k) = %.1f (expected %lld)", var, static_cast<long long>(dk));
    plot::BarChartSpec spec;
    spec.title = title;
    spec.subtitle = subtitle;
    spec.series = {{"Unscaled", pu[0], 0xff7f0e}, {"Scaled", ps[0], 0x1f77b4}};
    bars.push_back(plot::bar_chart(spec));
  }

  // ---- Pictures.
  if (args.pictures) {
    std::error_code ec;
    std::filesystem::create_directories(args.out_dir, ec);
    if (ec) {
      std::fprintf(stderr, "sdpa: error: --out-dir %s: expected a folder that can be created, got: %s\n",
                   args.out_dir.c_str(), ec.message().c_str());
      return kExitBadInput;
    }
    std::vector<std::string> labels;
    for (int id : kTokens) labels.push_back(picture_label(id));
    plot::HeatmapSpec spec;
    spec.row_labels = spec.col_labels = labels;
    spec.xlabel = "Key token (\u2423 = space)";
    spec.ylabel = "Query token";
    spec.title = "No mask (encoder)";
    const Picture no_mask = plot::heatmap(plot_matrix(weights_no_mask), spec);
    spec.title = "Causal mask (decoder)";
    const Picture causal = plot::heatmap(plot_matrix(weights), spec);
    std::vector<std::string> written;
    try {
      const std::filesystem::path dir(args.out_dir);
      write_picture((dir / "heatmap_no_mask.png").string(), no_mask, written);
      write_picture((dir / "heatmap_causal.png").string(), causal, written);
      write_picture((dir / "attention_heatmaps.png").string(),
                    plot::figure({no_mask, causal}, "Attention weights on \"the cat ate the rat\""), written);
      write_picture((dir / "scaling_softmax.png").string(),
                    plot::figure(bars, "Effect of \u221ad\u2096 scaling on attention distributions"), written);
    } catch (const Error& e) {
      std::fprintf(stderr, "sdpa: error: %s\n", e.what());
      return kExitBadInput;
    }
    std::printf("\nPictures\n");
    for (const std::string& path : written) std::printf("  %s\n", path.c_str());
  }
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace sdpa::cli
