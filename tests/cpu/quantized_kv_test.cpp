// int8 K/V with a float32 scale per (token, KV head) (Options::key_scale, value_scale;
// quantize_kv): the CPU forward against the float64 oracle, which reads scale · q
// exactly, over decode (L = 1..16), prefill, GQA, causal, masks, the split-key decode of
// long S and every query dtype; and the error against the unquantized K/V within the
// bound docs/numerics.md derives (not a guessed tolerance). quantize_kv's own guarantees:
// tests/api/quantize_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "testing/cases.h"
#include "testing/helpers.h"
#include "testing/rejection.h"
#include "testing/sequences.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A call's K and V quantized (either or both), with the options that read them.
struct Quantized {
  Tensor q, k, v;      // the query and the unquantized K/V (the query's dtype)
  QuantizedKV k8, v8;  // int8 and scales
  Tensor mask;
  Options options;
  bool int8_key = true, int8_value = true;
  TensorView key() const { return int8_key ? k8.values.view() : k.view(); }
  TensorView value() const { return int8_value ? v8.values.view() : v.view(); }
};

struct Shape4 {
  std::int64_t B = 1, Hq = 4, Hkv = 2, L = 1, S = 37, E = 16, Ev = 16;
};

Quantized make_quantized(const Shape4& s, DType query_dtype, std::uint64_t seed, bool int8_key = true,
                         bool int8_value = true) {
  std::mt19937_64 rng(seed);
  Quantized c;
  c.q = random_tensor(query_dtype, {s.B, s.Hq, s.L, s.E}, rng);
  c.k = random_tensor(query_dtype, {s.B, s.Hkv, s.S, s.E}, rng);  // as the query's, quantized below
  c.v = random_tensor(query_dtype, {s.B, s.Hkv, s.S, s.Ev}, rng);
  c.int8_key = int8_key;
  c.int8_value = int8_value;
  c.k8 = quantize_kv(c.k.view());
  c.v8 = quantize_kv(c.v.view());
  if (int8_key) c.options.key_scale = c.k8.scale.view();
  if (int8_value) c.options.value_scale = c.v8.scale.view();
  return c;
}

// What the int16 rounding of a bfloat16 query in the int8 decode scores (int8::pack_query,
// docs/numerics.md) may add to the lse, derived from the inputs: per query row, σ = the
// least power of two >= max_e |q_e| / 32767; an element that is not a multiple of σ moves
// by at most σ / 2, so key j's score by at most |scale| · s^K_j · σ/2 · Σ_{e moved} |k̂_je|,
// and the lse by at most the largest of these. 0 where the kernel never runs: other
// queries, float K, E > 512. (Added for any bfloat16 query with int8 K: a call's last
// task of a KV head's rows may hold few enough rows to decode, whatever L.)
double query_rounding_bound(const Quantized& c) {
  if (c.q.dtype() != DType::bfloat16 || !c.int8_key) return 0.0;
  const Tensor q = to_float64(c.q.view()), k = to_float64(c.k8.values.view()), ks = to_float64(c.k8.scale.view());
  const std::int64_t B = q.shape()[0], Hq = q.shape()[1], L = q.shape()[2], E = q.shape()[3];
  const std::int64_t Hkv = k.shape()[1], S = k.shape()[2];
  if (E > 512) return 0.0;
  const double scale = std::abs(c.options.scale.value_or(1.0 / std::sqrt(static_cast<double>(E))));
  double bound = 0.0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t row = ((b * Hq + h) * L + i) * E, head = b * Hkv + h / (Hq / Hkv);
        double largest = 0.0;
        for (std::int64_t e = 0; e < E; ++e) largest = std::max(largest, std::abs(q.get(row + e)));
        if (largest == 0.0) continue;
        const double sigma = std::exp2(std::ceil(std::log2(largest / 32767)));
        for (std::int64_t j = 0; j < S; ++j) {
          double moved = 0.0;  // Σ |k̂_je| over the elements the rounding moves
          for (std::int64_t e = 0; e < E; ++e)
            if (q.get(row + e) / sigma != std::nearbyint(q.get(row + e) / sigma))
              moved += std::abs(k.get((head * S + j) * E + e));
          bound = std::max(bound, scale * ks.get(head * S + j) * sigma / 2 * moved);
        }
      }
  return bound;
}

// Against the oracle on the same int8 inputs, by the rule of docs/numerics.md: float32's
// (or the naive low-precision error), plus what a bfloat16 query's int16 rounding adds.
void expect_agrees(const Quantized& c, const std::string& what) {
  Agreement a = compare_with_oracle(c.q.view(), c.key(), c.value(), c.options);
  const double delta = query_rounding_bound(c);
  if (delta > 0.0) {
    // The weights move by a factor within e^{±2Δ} (numerics.md, "a derived bound").
    const double v_max =
        max_abs(c.int8_value ? dequantized(c.v8.values.view(), c.v8.scale.view()) : to_float64(c.v.view()));
    const double kept = 1 - c.options.dropout_p;  // (dropout scales the kept weights by 1/kept)
    a.lse_tolerance += delta;
    a.output_tolerance += std::expm1(2 * delta) * v_max / kept;
    a.weights_tolerance += std::expm1(2 * delta) / kept;
  }
  EXPECT_TRUE(a.ok()) << what << ": " << a.describe();
}

// Decoding: L = 1..16 new queries against the quantized cache, GQA, bottom-right causal
// (the queries are the sequence's last), both K and V int8 or one of them.
// float32 and bfloat16 queries (the lse held to float32's rule, plus for bfloat16 the
// derived bound of its int16 rounding: expect_agrees).
TEST(QuantizedKV, DecodeMatchesOracle) {
  int n = 0;
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (std::int64_t L : {1, 2, 3, 5, 8, 16})
      for (std::int64_t S : {1, 17, 113, 1023})
        for (int which = 0; which < 3; ++which) {
          Shape4 s;
          s.L = L, s.S = S, s.Hq = 8, s.Hkv = 2, s.E = 40, s.Ev = 24;
          Quantized c = make_quantized(s, dtype, ++n, which != 2, which != 1);
          if (n % 2) c.options.causal = Causal::bottom_right;
          expect_agrees(c, std::string(dtype_name(dtype)) + " L " + std::to_string(L) + " S " + std::to_string(S) +
                               " which " + std::to_string(which));
        }
}

// Prefill (L = S, top-left causal), GQA ratios 1, 2, 5, head dims off the vector width.
TEST(QuantizedKV, PrefillAndGqaMatchOracle) {
  int n = 100;
  for (std::int64_t group : {1, 2, 5})
    for (std::int64_t E : {1, 8, 111, 128})
      for (Causal causal : {Causal::none, Causal::top_left}) {
        Shape4 s;
        s.B = 2, s.Hkv = 2, s.Hq = 2 * group, s.L = 129, s.S = 129, s.E = E, s.Ev = E == 1 ? 3 : E;
        Quantized c = make_quantized(s, DType::float32, ++n);
        c.options.causal = causal;
        expect_agrees(c, "group " + std::to_string(group) + " E " + std::to_string(E));
      }
}

// Long query groups on AVX-512 take subtiles of 3 row vectors (simd/forward.cpp:
// ThreeVectorsPay: here 4 batch elements × 4 KV heads of 288 query rows, 32 tasks), whose
// K and V tiles widen int8 to float32 the same way.
TEST(QuantizedKV, ThreeVectorSubtilesMatchOracle) {
  Shape4 s;
  s.B = 4, s.Hkv = 4, s.Hq = 8, s.L = 144, s.S = 130, s.E = 24, s.Ev = 16;
  for (int which = 0; which < 3; ++which) {
    Quantized c = make_quantized(s, DType::float32, 400 + which, which != 2, which != 1);
    c.options.causal = which == 1 ? Causal::bottom_right : Causal::none;
    expect_agrees(c, "which " + std::to_string(which));
  }
}

// Sequences of 962 query rows: the last task of a sequence is short enough (≤ kFewRows
// rows) for the decode row kernels, which round differently from the tiles, under one
// blocking of the rows (3 vectors: 962 − 5·192 = 2 rows) and not the other (2 vectors:
// 962 − 7·128 = 66). The blocking is decided per sequence, so each sequence gets the
// bits it gets alone.
TEST(QuantizedKV, VarlenSequencesGiveTheBitsOfEachSequenceAlone) {
  std::mt19937_64 rng(901);
  const std::int64_t sequences = 4, L = 962, S = 64, E = 64, Ev = 16;
  const Tensor q = random_tensor(DType::float32, {1, sequences * L, E}, rng);
  const Tensor k = random_tensor(DType::float32, {1, sequences * S, E}, rng),
               v = random_tensor(DType::float32, {1, sequences * S, Ev}, rng);
  const QuantizedKV k8 = quantize_kv(k.view());
  VarlenSequences seqs;
  for (std::int64_t b = 0; b <= sequences; ++b) {
    seqs.cu_seqlens_q.push_back(b * L);
    seqs.cu_seqlens_k.push_back(b * S);
  }
  Options o;
  o.key_scale = k8.scale.view();
  const ForwardResult packed = forward_varlen(q.view(), k8.values.view(), v.view(), seqs, o);
  for (std::int64_t b = 0; b < sequences; ++b) {
    Options ob = o;
    ob.key_scale = sequence_rows(k8.scale.view(), b * S, (b + 1) * S);
    const ForwardResult alone =
        forward(sequence_rows(q.view(), b * L, (b + 1) * L), sequence_rows(k8.values.view(), b * S, (b + 1) * S),
                sequence_rows(v.view(), b * S, (b + 1) * S), ob);
    EXPECT_TRUE(bitwise_equal(to_float64(sequence_rows(packed.output.view(), b * L, (b + 1) * L)),
                              to_float64(alone.output.view())))
        << "sequence " << b;
  }
}

// Every query dtype: bfloat16 and float16 queries read int8 K/V on the float32 path,
// float64 ones on the float64 path (exact dequantization per tile).
TEST(QuantizedKV, EveryQueryDtypeMatchesOracle) {
  int n = 200;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16, DType::float64})
    for (std::int64_t L : {1, 7}) {
      Shape4 s;
      s.L = L, s.S = 300, s.Hq = 6, s.Hkv = 2, s.E = 64, s.Ev = 32;
      Quantized c = make_quantized(s, dtype, ++n);
      expect_agrees(c, dtype_name(dtype));
    }
  // A bfloat16 query's decode at the row counts the tests above leave out (its scores on
  // vpdpwssd where the CPU has it: int8::row_scores, 16/R keys a block).
  for (std::int64_t rows : {1, 5, 7}) {
    Shape4 s;
    s.L = 1, s.S = 342, s.Hq = rows, s.Hkv = 1, s.E = 40, s.Ev = 24;
    Quantized c = make_quantized(s, DType::bfloat16, ++n);
    expect_agrees(c, "bfloat16 rows " + std::to_string(rows));
  }
}

// Masks (bool and additive, broadcast), the window, ALiBi, softcap and sinks on top.
TEST(QuantizedKV, MasksAndModifiersMatchOracle) {
  Shape4 s;
  s.B = 2, s.Hq = 4, s.Hkv = 2, s.L = 5, s.S = 200, s.E = 32, s.Ev = 20;
  std::mt19937_64 rng(300);
  for (int variant = 0; variant < 4; ++variant) {
    Quantized c = make_quantized(s, DType::float32, 301 + variant);
    Tensor slopes, sinks;
    if (variant == 0) {
      c.mask = random_bool({s.B, 1, s.L, s.S}, rng, 0.7);
      c.options.mask = c.mask.view();
    } else if (variant == 1) {
      c.mask = random_tensor(DType::float32, {s.S}, rng);
      c.options.mask = c.mask.view();
      c.options.causal = Causal::bottom_right;
    } else if (variant == 2) {
      c.options.window_left = 30;
      c.options.causal = Causal::bottom_right;
      slopes = alibi_slopes(DType::float32, {s.B}, s.Hq, true);
      c.options.alibi_slopes = slopes.view();
      c.options.softcap = 5;
    } else {
      sinks = sink_logits(DType::float32, {s.B}, s.Hq, true);
      c.options.sinks = sinks.view();
      c.options.dropout_p = 0.25;
      c.options.seed = 7;
    }
    expect_agrees(c, "variant " + std::to_string(variant));
  }
}

// Scores that rise from one 192-key decode tile to the next, each query row at its own
// pace (by ~4, 9, 13 and 17 a tile in log2 units, then by ~45 to ~180 into the last,
// short tile): the softmax's reference max moves (by more than 8, NextReferenceMax), so
// the int8 P·V's rows, summed row-major over the task's tiles, must be rescaled with Oᵀ
// (and dropped where α = 2^(m − m') is 0). Second, row 0's scores ~108 (log2) lower in
// the second tile than in the first, so that its largest weight there is under 2^-96
// and the whole tile keeps float32 (summed in Oᵀ) — a quarter of the other rows' weight
// (their scores nearly flat) — between tiles summed row-major: both sums must be rescaled
// (row 0's max then rises by ~17 a tile) and added.
TEST(QuantizedKV, DecodeScoresRisingAcrossTilesMatchOracle) {
  Shape4 s;
  s.Hq = 4, s.Hkv = 1, s.L = 1, s.S = 4 * 192 + 50, s.E = 16, s.Ev = 24;
  struct Case {
    std::array<double, 4> q;       // row h's query elements (its score: 4 q[h] · its key's level)
    std::array<double, 5> levels;  // a tile's keys' elements, ± 0.3
    const char* what;
  };
  for (const Case& k : {Case{{0.25, 0.5, 0.75, 1.0}, {0.0, 3.0, 6.0, 9.0, 40.0}, "rising"},
                        Case{{1.0, 0.01, 0.02, 0.03}, {0.0, -18.75, 3.0, 6.0, 10.0}, "a float32 tile between"}}) {
    Quantized c = make_quantized(s, DType::bfloat16, 77);
    for (std::int64_t h = 0; h < s.Hq; ++h)
      for (std::int64_t e = 0; e < s.E; ++e) c.q.set(h * s.E + e, k.q[h]);
    std::mt19937_64 rng(78);
    std::uniform_real_distribution<double> noise(-0.3, 0.3);
    for (std::int64_t j = 0; j < s.S; ++j)
      for (std::int64_t e = 0; e < s.E; ++e) c.k.set(j * s.E + e, k.levels[j / 192] + noise(rng));
    c.k8 = quantize_kv(c.k.view());
    c.options.key_scale = c.k8.scale.view();
    expect_agrees(c, k.what);
  }
}

// The decode microkernels (decode_rows-inl.h) take a task of few rows (group · L <=
// kFewRows = 8): head dims with every tail against the vector width, K or V alone int8;
// S = 342, a whole 192-key decode tile (kDecodeKeyTile) and a shorter one.
TEST(QuantizedKV, DecodeKernelHeadDimTailsMatchOracle) {
  int n = 600;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16})
    for (std::int64_t E : {1, 3, 17, 33, 111, 128, 200})
      for (std::int64_t L : {1, 3, 4})
        for (int which = 0; which < 3; ++which) {
          Shape4 s;
          s.Hq = 4, s.Hkv = 2, s.L = L, s.S = 342, s.E = E, s.Ev = E == 1 ? 3 : E;
          Quantized c = make_quantized(s, dtype, ++n, which != 2, which != 1);
          c.options.causal = Causal::bottom_right;
          expect_agrees(c, std::string(dtype_name(dtype)) + " E " + std::to_string(E) + " L " + std::to_string(L) +
                               " which " + std::to_string(which));
        }
}

// Every modifier on the decode path (Hq/Hkv = 2, L = 4: group · L = 8 rows), then a
// fully masked row (output 0 and lse −inf, as the oracle) and a NaN query (its row NaN).
// For float32 and bfloat16 queries.
void ExpectDecodeModifiersMatchOracle(DType dtype) {
  Shape4 s;
  s.B = 2, s.Hq = 4, s.Hkv = 2, s.L = 4, s.S = 90, s.E = 24, s.Ev = 17;
  std::mt19937_64 rng(700);
  for (int variant = 0; variant < 6; ++variant) {
    Quantized c = make_quantized(s, dtype, 701 + variant);
    Tensor slopes, sinks;
    if (variant == 0 || variant == 5) {
      c.mask = random_bool({s.B, s.Hq, s.L, s.S}, rng, 0.6);
      c.options.mask = c.mask.view();
    }
    if (variant == 1) {
      c.mask = random_tensor(DType::float32, {s.L, s.S}, rng);
      c.options.mask = c.mask.view();
    }
    if (variant == 2 || variant == 5) {
      slopes = alibi_slopes(DType::float32, {s.B}, s.Hq, true);
      c.options.alibi_slopes = slopes.view();
      c.options.causal = Causal::bottom_right;
    }
    if (variant == 3 || variant == 5) c.options.softcap = 4;
    if (variant == 4 || variant == 5) {
      sinks = sink_logits(DType::float32, {s.B}, s.Hq, true);
      c.options.sinks = sinks.view();
      c.options.dropout_p = 0.3;
      c.options.seed = 11;
    }
    expect_agrees(c, std::string(dtype_name(dtype)) + " variant " + std::to_string(variant));
  }

  Quantized c = make_quantized(s, dtype, 710);
  c.mask = random_bool({s.B, s.Hq, s.L, s.S}, rng, 0.6);
  for (std::int64_t j = 0; j < s.S; ++j) c.mask.set(((1 * s.Hq + 2) * s.L + 3) * s.S + j, 0);  // (b 1, h 2, row 3)
  c.options.mask = c.mask.view();
  c.q.set(((0 * s.Hq + 1) * s.L + 2) * s.E + 5, std::nan(""));  // (b 0, h 1, row 2)
  expect_agrees(c, std::string(dtype_name(dtype)) + ": fully masked row and NaN query");
  const ForwardResult r = forward(c.q.view(), c.key(), c.value(), c.options, Returns{false, true});
  for (std::int64_t e = 0; e < s.Ev; ++e) {
    EXPECT_EQ(r.output.get(((1 * s.Hq + 2) * s.L + 3) * s.Ev + e), 0.0) << "fully masked row, e " << e;
    EXPECT_TRUE(std::isnan(r.output.get(((0 * s.Hq + 1) * s.L + 2) * s.Ev + e))) << "NaN query, e " << e;
  }
  EXPECT_EQ(r.lse.get((1 * s.Hq + 2) * s.L + 3), -kInf);
}

TEST(QuantizedKV, DecodeKernelModifiersMatchOracle) {
  for (DType dtype : {DType::float32, DType::bfloat16}) ExpectDecodeModifiersMatchOracle(dtype);
}

// Long S with few query rows: the keys split into ranges merged by log-sum-exp; the
// merge must agree with the oracle and be bitwise the same for any thread count.
TEST(QuantizedKV, SplitKeyDecodeMatchesOracleAndIsDeterministic) {
  Shape4 s;
  s.Hq = 8, s.Hkv = 2, s.L = 1, s.S = 9001, s.E = 32, s.Ev = 32;
  // (A bfloat16 query: 4 rows a KV head on the int8 kernels where the CPU has VNNI, the
  // P·V's rows summed row-major over each split's tiles.)
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    Quantized c = make_quantized(s, dtype, 400);
    expect_agrees(c, std::string("L 1 ") + dtype_name(dtype));
    std::vector<Tensor> outputs;
    for (int threads : {1, 2, 3}) {
      c.options.num_threads = threads;
      outputs.push_back(forward(c.q.view(), c.key(), c.value(), c.options).output);
    }
    EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].nbytes()), 0);
    EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[2].data(), outputs[0].nbytes()), 0);
  }
  s.L = 3;
  Quantized c3 = make_quantized(s, DType::bfloat16, 401);
  c3.options.causal = Causal::bottom_right;
  expect_agrees(c3, "L 3 bfloat16");
}

// A (B, S, Hkv, E) int8 buffer viewed as (B, Hkv, S, E), its scales (B, S, Hkv) viewed
// as (B, Hkv, S): the kernels follow any strides of both.
TEST(QuantizedKV, TokenMajorStridedCacheMatchesOracle) {
  Shape4 s;
  s.B = 2, s.Hq = 4, s.Hkv = 2, s.L = 3, s.S = 50, s.E = 16, s.Ev = 16;
  std::mt19937_64 rng(500);
  const Tensor q = random_tensor(DType::float32, {s.B, s.Hq, s.L, s.E}, rng);
  const Tensor k = random_tensor(DType::float32, {s.B, s.S, s.Hkv, s.E}, rng);  // token-major storage
  const Tensor v = random_tensor(DType::float32, {s.B, s.S, s.Hkv, s.Ev}, rng);
  const QuantizedKV k8 = quantize_kv(k.view()), v8 = quantize_kv(v.view());
  auto permuted = [](TensorView view) {  // swap dims 1 and 2
    view.strides = view.effective_strides();
    std::swap(view.shape[1], view.shape[2]);
    std::swap(view.strides[1], view.strides[2]);
    return view;
  };
  Options o;
  o.key_scale = permuted(k8.scale.view());
  o.value_scale = permuted(v8.scale.view());
  o.causal = Causal::bottom_right;
  const Agreement a = compare_with_oracle(q.view(), permuted(k8.values.view()), permuted(v8.values.view()), o);
  EXPECT_TRUE(a.ok()) << a.describe();
}

// Packed variable-length batches: int8 K/V (Hkv, total_k, ·) with scales (Hkv, total_k);
// each sequence equals forward() on its own slice of the int8 rows and scales.
TEST(QuantizedKV, VarlenEqualsForwardOnEachSequence) {
  std::mt19937_64 rng(900);
  const std::vector<std::int64_t> cu_q = {0, 1, 4, 4, 9}, cu_k = {0, 30, 31, 31, 130};
  const std::int64_t Hq = 4, Hkv = 2, E = 24, Ev = 8;
  const Tensor q = random_tensor(DType::float32, {Hq, 9, E}, rng);
  const Tensor k = random_tensor(DType::float32, {Hkv, 130, E}, rng),
               v = random_tensor(DType::float32, {Hkv, 130, Ev}, rng);
  const QuantizedKV k8 = quantize_kv(k.view()), v8 = quantize_kv(v.view());
  Options o;
  o.causal = Causal::bottom_right;
  o.key_scale = k8.scale.view();
  o.value_scale = v8.scale.view();
  const ForwardResult packed = forward_varlen(q.view(), k8.values.view(), v8.values.view(), {cu_q, cu_k}, o);
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    Options ob = o;
    ob.key_scale = sequence_rows(k8.scale.view(), cu_k[b], cu_k[b + 1]);
    ob.value_scale = sequence_rows(v8.scale.view(), cu_k[b], cu_k[b + 1]);
    const ForwardResult alone =
        forward(sequence_rows(q.view(), cu_q[b], cu_q[b + 1]), sequence_rows(k8.values.view(), cu_k[b], cu_k[b + 1]),
                sequence_rows(v8.values.view(), cu_k[b], cu_k[b + 1]), ob);
    const Tensor want = to_float64(alone.output.view());
    const Tensor got = to_float64(sequence_rows(packed.output.view(), cu_q[b], cu_q[b + 1]));
    EXPECT_LE(max_abs_diff(got, want), 1e-6 * std::max(1.0, max_abs(want))) << "sequence " << b;
  }
}

// The error against the *unquantized* K/V: each element moves by at most s/2 (s its
// row's scale), so with the query row q_i a score moves by at most
//   Δ_i = |scale| · ‖q_i‖₁ · max_j s^K_j / 2   (softcap's tanh is 1-Lipschitz: no more),
// the weights by a factor within e^{±2Δ_i}, hence Σ_j |p̂_j − p_j| <= e^{2Δ_i} − 1, and
//   |ô_id − o_id| <= (e^{2Δ_i} − 1) · max_j |v_jd| + max_j s^V_j / 2,   |lse_i − lse_i| <= Δ_i
// plus the kernel's own float32 error (1e-5 of the output scale); with dropout (the same
// mask on both sides) the output bound over 1 − p. docs/numerics.md.
TEST(QuantizedKV, ErrorAgainstUnquantizedWithinTheDerivedBound) {
  int n = 700;
  for (double stddev : {0.3, 1.0})
    for (std::int64_t L : {1, 4})
      for (const auto& [softcap, dropout_p] : {std::pair{0.0, 0.0}, {20.0, 0.0}, {0.0, 0.4}}) {
        Shape4 s;
        s.Hq = 8, s.Hkv = 2, s.L = L, s.S = 500, s.E = 64, s.Ev = 64;
        std::mt19937_64 rng(++n);
        const Tensor q = random_tensor(DType::float32, {s.B, s.Hq, s.L, s.E}, rng, stddev);
        const Tensor k = random_tensor(DType::float32, {s.B, s.Hkv, s.S, s.E}, rng, stddev);
        const Tensor v = random_tensor(DType::float32, {s.B, s.Hkv, s.S, s.Ev}, rng);
        const QuantizedKV k8 = quantize_kv(k.view()), v8 = quantize_kv(v.view());
        Options exact;
        exact.backend = Backend::reference;
        exact.softcap = softcap;
        exact.dropout_p = dropout_p;  // the same mask on both sides (Philox on the global indices)
        exact.seed = 99;
        exact.causal = Causal::bottom_right;
        const ForwardResult want = forward(to_float64(q.view()).view(), to_float64(k.view()).view(),
                                           to_float64(v.view()).view(), exact, Returns{false, true});
        Options quantized = exact;
        quantized.backend = Backend::cpu;
        quantized.key_scale = k8.scale.view();
        quantized.value_scale = v8.scale.view();
        const ForwardResult got =
            forward(q.view(), k8.values.view(), v8.values.view(), quantized, Returns{false, true});

        const double scale = 1.0 / std::sqrt(static_cast<double>(s.E));
        const double kernel = 1e-5 * std::max(1.0, max_abs(want.output));
        const std::int64_t group = s.Hq / s.Hkv;
        double worst = 0, worst_lse = 0;
        for (std::int64_t h = 0; h < s.Hq; ++h) {
          const std::int64_t hk = h / group;
          double sk = 0, sv = 0;
          for (std::int64_t j = 0; j < s.S; ++j) {
            sk = std::max(sk, k8.scale.get(hk * s.S + j));
            sv = std::max(sv, v8.scale.get(hk * s.S + j));
          }
          for (std::int64_t i = 0; i < s.L; ++i) {
            double q1 = 0;
            for (std::int64_t e = 0; e < s.E; ++e) q1 += std::abs(q.get((h * s.L + i) * s.E + e));
            const double delta = scale * q1 * sk / 2;
            for (std::int64_t d = 0; d < s.Ev; ++d) {
              double vmax = 0;
              for (std::int64_t j = 0; j < s.S; ++j) vmax = std::max(vmax, std::abs(v.get((hk * s.S + j) * s.Ev + d)));
              // Dropout scales every kept weight, and so the bound, by 1 / (1 − p) (docs/numerics.md).
              const double bound = (std::expm1(2 * delta) * vmax + sv / 2) / (1 - dropout_p) + kernel;
              const double err =
                  std::abs(got.output.get((h * s.L + i) * s.Ev + d) - want.output.get((h * s.L + i) * s.Ev + d));
              EXPECT_LE(err, bound) << "h " << h << " i " << i << " d " << d;
              worst = std::max(worst, err / bound);
            }
            const double lse_err = std::abs(got.lse.get(h * s.L + i) - want.lse.get(h * s.L + i));
            EXPECT_LE(lse_err, delta + 1e-5 * std::max(1.0, std::abs(want.lse.get(h * s.L + i))));
            worst_lse = std::max(worst_lse, lse_err / delta);
          }
        }
        // Not vacuous: the quantized result does differ from the exact one.
        EXPECT_GT(max_abs_diff(to_float64(got.output.view()), want.output), 1e-6);
        RecordProperty("worst_fraction_of_bound_" + std::to_string(n), std::to_string(worst));
      }
}

// The backward refuses int8 K/V (inference only), naming the argument.
TEST(QuantizedKV, BackwardRefusesInt8) {
  Shape4 s;
  Quantized c = make_quantized(s, DType::float32, 800);
  const ForwardResult fwd = forward(c.q.view(), c.key(), c.value(), c.options, Returns{false, true});
  Tensor dq(DType::float32, c.q.shape()), dk(DType::float32, c.k.shape()), dv(DType::float32, c.v.shape());
  fill_with_sentinel({&dq, &dk, &dv});
  const Tensor dout = convert(fwd.output, DType::float32);
  const BackwardInputs in{c.q.view(), c.key(), c.value(), fwd.output.view(), fwd.lse.view(), dout.view()};
  expect_rejected_naming([&] { backward(in, {dq.view(), dk.view(), dv.view()}, c.options); }, "key", {&dq, &dk, &dv});
}

// Without its scales, an int8 key is still refused for what it is (the backward has no
// int8 path), not for the scale it lacks: a caller told "key_scale: expected a scale"
// would add one only to be refused again.
TEST(QuantizedKV, BackwardRefusesInt8BeforeAskingForItsScale) {
  Shape4 s;
  Quantized c = make_quantized(s, DType::float32, 801);
  const ForwardResult fwd = forward(c.q.view(), c.key(), c.value(), c.options, Returns{false, true});
  Options unscaled = c.options;
  unscaled.key_scale.reset();
  unscaled.value_scale.reset();
  Tensor dq(DType::float32, c.q.shape()), dk(DType::float32, c.k.shape()), dv(DType::float32, c.v.shape());
  fill_with_sentinel({&dq, &dk, &dv});
  const Tensor dout = convert(fwd.output, DType::float32);
  const BackwardInputs in{c.q.view(), c.key(), c.value(), fwd.output.view(), fwd.lse.view(), dout.view()};
  for (const auto& call :
       std::vector<std::function<void()>>{[&] {
                                            backward(in, {dq.view(), dk.view(), dv.view()}, unscaled);
                                          },
                                          [&] { backward(in, unscaled); }}) {
    try {
      call();
      ADD_FAILURE() << "accepted an int8 key";
    } catch (const Error& e) {
      expect_error_names(e, "key", {"not supported by the backward"}, ErrorKind::type);
    }
  }
  EXPECT_TRUE(untouched(dq) && untouched(dk) && untouched(dv));
}

}  // namespace
}  // namespace sdpa::testing
