// forward_varlen / backward_varlen (include/sdpa/sdpa.h), FlashAttention's packed
// variable-length batches: against forward() / backward() on each sequence alone and the
// float64 formula, dropout against a padded call, caller buffers through permuted
// strides, empty batches; and the rejection of bad cu_seqlens, masks, weights and slopes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "testing/cases.h"
#include "testing/formula.h"
#include "testing/gradients.h"
#include "testing/rejection.h"
#include "testing/sequences.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A (total, heads, dim) buffer viewed as (heads, total, dim): FlashAttention's packed
// layout as the API takes it.
struct Packed {
  Tensor storage;
  TensorView view;
};

Packed packed_random(DType dtype, std::int64_t heads, std::int64_t total, std::int64_t dim, std::mt19937_64& rng) {
  Packed p{random_tensor(dtype, {total, heads, dim}, rng), {}};
  p.view = p.storage.view();
  p.view.shape = {heads, total, dim};
  p.view.strides = {dim, heads * dim, 1};
  return p;
}

// (L_b, S_b): an empty query sequence, a sequence with no keys (zero output, lse −inf),
// L > S, L < S over several key tiles, L = S.
using Lengths = std::vector<std::pair<std::int64_t, std::int64_t>>;
const Lengths kSequenceLengths = {{5, 9}, {0, 4}, {1, 0}, {40, 33}, {17, 130}, {3, 3}};

// Sequence b's query rows [q0, q1) and key rows [k0, k1) in the packed tensors.
struct SequenceRows {
  std::int64_t q0, q1, k0, k1;
};
SequenceRows rows_of(const VarlenSequences& s, std::int64_t b) {
  return {s.cu_seqlens_q[b], s.cu_seqlens_q[b + 1], s.cu_seqlens_k[b], s.cu_seqlens_k[b + 1]};
}

VarlenSequences sequences_of(const Lengths& lengths) {
  VarlenSequences s{{0}, {0}};
  for (auto [L, S] : lengths) {
    s.cu_seqlens_q.push_back(s.cu_seqlens_q.back() + L);
    s.cu_seqlens_k.push_back(s.cu_seqlens_k.back() + S);
  }
  return s;
}

struct VarlenInputs {
  Packed q, k, v;
  VarlenSequences seqs;
  Tensor slopes, sinks;
  std::int64_t batch = 0;
};

VarlenInputs make_varlen(DType dtype, std::int64_t Hq, std::int64_t Hkv, std::int64_t E, std::int64_t Ev,
                         const Lengths& lengths, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  VarlenInputs in;
  in.seqs = sequences_of(lengths);
  in.batch = static_cast<std::int64_t>(lengths.size());
  in.q = packed_random(dtype, Hq, in.seqs.cu_seqlens_q.back(), E, rng);
  in.k = packed_random(dtype, Hkv, in.seqs.cu_seqlens_k.back(), E, rng);
  in.v = packed_random(dtype, Hkv, in.seqs.cu_seqlens_k.back(), Ev, rng);
  return in;
}

struct VarlenOptions {
  const char* name;
  Causal causal;
  std::optional<Alignment> alignment;
  std::int64_t left, right;
  int slopes;  // 0 none, 1 (Hq,), 2 (batch, Hq)
  double softcap;
  int sinks = 0;  // as slopes
};

const VarlenOptions kVarlenOptions[] = {
    {"plain", Causal::none, std::nullopt, -1, -1, 0, 0},
    {"causal top-left", Causal::top_left, std::nullopt, -1, -1, 0, 0},
    {"causal bottom-right", Causal::bottom_right, std::nullopt, -1, -1, 0, 0},
    {"window bottom-right", Causal::none, std::nullopt, 4, 2, 0, 0},
    {"window top-left, alibi (Hq,), softcap, sinks (batch, Hq)", Causal::none, Alignment::top_left, 6, 20, 1, 5, 2},
    {"causal bottom-right, window, alibi (batch, Hq), softcap, sinks (Hq,)", Causal::bottom_right, std::nullopt, 8, -1,
     2, 30, 1},
};

// The options of `vo`, with in.slopes and in.sinks (sized for the batch) when it uses them.
Options options_of(const VarlenOptions& vo, VarlenInputs& in) {
  in.slopes = alibi_slopes(DType::float64, {in.batch}, in.q.view.shape[0], vo.slopes == 2);
  // float64 sinks for float64 inputs: the sinks' gradient has their dtype.
  in.sinks = sink_logits(in.q.view.dtype == DType::float64 ? DType::float64 : DType::float32, {in.batch},
                         in.q.view.shape[0], vo.sinks == 2);
  Options o;
  o.causal = vo.causal;
  o.alignment = vo.alignment;
  o.window_left = vo.left;
  o.window_right = vo.right;
  o.softcap = vo.softcap;
  if (vo.slopes) o.alibi_slopes = in.slopes.view();
  if (vo.sinks) o.sinks = in.sinks.view();
  return o;
}

// Options o for sequence b alone: its row of per-batch slopes and sinks.
Options sequence_options(const Options& o, const VarlenInputs& in, std::int64_t b) {
  Options ob = o;
  if (o.alibi_slopes) ob.alibi_slopes = per_head_of_sequence(in.slopes, b);
  if (o.sinks) ob.sinks = per_head_of_sequence(in.sinks, b);
  return ob;
}

TEST(Varlen, EqualsForwardOnEachSequenceAlone) {
  const Lengths& lengths = kSequenceLengths;
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8;
  int n = 0;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (const VarlenOptions& vo : kVarlenOptions) {
        if (dtype != DType::float32 && backend == Backend::reference) continue;
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " " << vo.name);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, ++n);
        Options o = options_of(vo, in);
        o.backend = backend;
        const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        ASSERT_EQ(packed.output.shape(), (Shape{Hq, in.seqs.cu_seqlens_q.back(), Ev}));
        ASSERT_EQ(packed.lse.shape(), (Shape{Hq, in.seqs.cu_seqlens_q.back()}));
        for (std::int64_t b = 0; b < in.batch; ++b) {
          const auto [q0, q1, k0, k1] = rows_of(in.seqs, b);
          const Options ob = sequence_options(o, in, b);
          const ForwardResult alone = forward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                              sequence_rows(in.v.view, k0, k1), ob, Returns{false, true});
          const Tensor want = to_float64(alone.output.view()), want_lse = to_float64(alone.lse.view());
          const Tensor got = to_float64(sequence_rows(packed.output.view(), q0, q1));
          const Tensor got_lse = to_float64(sequence_rows(packed.lse.view(), q0, q1));
          EXPECT_LE(max_abs_diff(got, want), same_result_tolerance(dtype, max_abs(want))) << "sequence " << b;
          EXPECT_LE(max_abs_diff(got_lse, want_lse), same_result_tolerance(DType::float32, max_abs(want_lse)))
              << "sequence " << b;
          if (k1 == k0) {  // no keys: zero output, lse −inf (or the sink)
            for (std::int64_t r = 0; r < got.numel(); ++r) EXPECT_EQ(got.get(r), 0.0) << "sequence " << b;
            for (std::int64_t r = 0; r < got_lse.numel() && !vo.sinks; ++r)
              EXPECT_EQ(got_lse.get(r), -kInf) << "sequence " << b;
          }
        }
      }
}

// Each packed sequence's output has the bits of the same sequence alone.
void expect_bits_of_each_sequence_alone(const VarlenInputs& in, const Options& o) {
  const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o);
  for (std::int64_t b = 0; b < in.batch; ++b) {
    const auto [q0, q1, k0, k1] = rows_of(in.seqs, b);
    const ForwardResult alone = forward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                        sequence_rows(in.v.view, k0, k1), o);
    EXPECT_TRUE(bitwise_equal(to_float64(sequence_rows(packed.output.view(), q0, q1)), to_float64(alone.output.view())))
        << "sequence " << b;
  }
}

// The same bits as each sequence alone, not only the same values within a tolerance,
// where the SIMD forward's blocking of query rows (2 or 3 row vectors per subtile, on
// AVX-512) could differ between the packed call and the sequence alone — it is decided
// per sequence. Here: sequences of 192 rows whose long keys split for decoding (the
// split count follows the task count), and sequences of 960 rows, causal, with a NaN
// value at key 40: a row sees 0·V of a key that only a row of its own subtile sees, so
// which rows come out NaN depends on how rows group into subtiles.
TEST(Varlen, SequencesGiveTheBitsOfTheSequenceAloneWhateverTheBlocking) {
  Options o;
  o.backend = Backend::cpu;
  expect_bits_of_each_sequence_alone(make_varlen(DType::float32, 8, 8, 16, 16, {{192, 8192}, {192, 8192}}, 91), o);
  VarlenInputs nan_values = make_varlen(DType::float32, 1, 1, 16, 16, Lengths(4, {960, 960}), 92);
  for (std::int64_t b = 0; b < nan_values.batch; ++b)
    nan_values.v.storage.set((b * 960 + 40) * 16, std::numeric_limits<double>::quiet_NaN());
  o.causal = Causal::top_left;
  expect_bits_of_each_sequence_alone(nan_values, o);
}

// Against the oracle directly (not only against forward() of the same backend): the
// CPU's packed result for each sequence by the tolerance rule's float32 bound.
TEST(Varlen, CpuMatchesOracleFormulaPerSequence) {
  const Lengths& lengths = kSequenceLengths;
  VarlenInputs in = make_varlen(DType::float32, 4, 2, 16, 8, lengths, 77);
  Options o = options_of(kVarlenOptions[5], in);
  o.backend = Backend::cpu;
  const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
  for (std::int64_t b = 0; b < in.batch; ++b) {
    const auto [q0, q1, k0, k1] = rows_of(in.seqs, b);
    const Options ob = sequence_options(o, in, b);
    const Expected want = expected_attention(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                             sequence_rows(in.v.view, k0, k1), ob);
    EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.output.view(), q0, q1)), want.output),
              1e-5 * std::max(1.0, max_abs(want.output)))
        << "sequence " << b;
    EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.lse.view(), q0, q1)), want.lse),
              1e-5 * std::max(1.0, max_abs(want.lse)))
        << "sequence " << b;
  }
}

// The padded form of a packed (H, total, D) view: (batch, H, longest, D), sequence b's
// rows at batch element b, zeros after them.
Tensor padded(const TensorView& packed, const std::vector<std::int64_t>& cu, std::int64_t longest) {
  const std::int64_t B = static_cast<std::int64_t>(cu.size()) - 1, H = packed.shape[0], D = packed.shape[2];
  Tensor t(packed.dtype, {B, H, longest, D});
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = cu[b + 1] - cu[b];
    const Tensor rows = to_float64(sequence_rows(packed, cu[b], cu[b + 1]));
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < len; ++i)
        for (std::int64_t e = 0; e < D; ++e)
          t.set(((b * H + h) * longest + i) * D + e, rows.get((h * len + i) * D + e));
  }
  return t;
}

// The first `len` rows of batch element b of a packed (B, H, longest[, D]) tensor, as a
// (1, H, len[, D]) float64 tensor.
Tensor unpadded(const Tensor& t, std::int64_t b, std::int64_t len) {
  TensorView v = t.view();
  const Shape st = contiguous_strides(t.shape());
  v.data = static_cast<std::byte*>(v.data) + b * st[0] * static_cast<std::int64_t>(dtype_size(t.dtype()));
  v.shape[0] = 1;
  v.shape[2] = len;
  v.strides = st;
  return to_float64(v);
}

struct PaddedBatch {
  Tensor q, k, v, mask;  // mask (B, 1, 1, Smax): true for each sequence's real keys
  std::int64_t Lmax = 0, Smax = 0;
};

PaddedBatch pad(const VarlenInputs& in) {
  PaddedBatch p;
  for (std::int64_t b = 0; b < in.batch; ++b) {
    p.Lmax = std::max(p.Lmax, in.seqs.cu_seqlens_q[b + 1] - in.seqs.cu_seqlens_q[b]);
    p.Smax = std::max(p.Smax, in.seqs.cu_seqlens_k[b + 1] - in.seqs.cu_seqlens_k[b]);
  }
  p.q = padded(in.q.view, in.seqs.cu_seqlens_q, p.Lmax);
  p.k = padded(in.k.view, in.seqs.cu_seqlens_k, p.Smax);
  p.v = padded(in.v.view, in.seqs.cu_seqlens_k, p.Smax);
  p.mask = Tensor(DType::boolean, {in.batch, 1, 1, p.Smax});
  for (std::int64_t b = 0; b < in.batch; ++b)
    for (std::int64_t j = 0; j < p.Smax; ++j)
      p.mask.set(b * p.Smax + j, j < in.seqs.cu_seqlens_k[b + 1] - in.seqs.cu_seqlens_k[b] ? 1.0 : 0.0);
  return p;
}

// Dropout options for the padded comparison, plain or with top-left causal, a window,
// ALiBi (batch, Hq) and softcap: top-left, so that padding moves no diagonal.
Options dropout_options(Backend backend, int variant, const Tensor& slopes) {
  Options o;
  o.backend = backend;
  o.dropout_p = 0.3;
  o.seed = 1234;
  o.offset = 5;
  if (variant == 1) {
    o.causal = Causal::top_left;
    o.window_left = 7;
    o.alibi_slopes = slopes.view();
    o.softcap = 10;
  }
  return o;
}

// Dropout: sequence b draws as batch element b of a padded (batch, Hq, Lmax, Smax) call
// whose padding keys a bool mask removes (rows < L_b compared).
TEST(Varlen, DropoutDrawsAsThePaddedBatch) {
  const Lengths& lengths = kSequenceLengths;
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8, B = static_cast<std::int64_t>(lengths.size());
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (int variant = 0; variant < 2; ++variant) {
        if (dtype == DType::bfloat16 && backend == Backend::reference) continue;
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " variant " << variant);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, 31 + variant);
        in.slopes = alibi_slopes(DType::float32, {B}, Hq, true);
        const Options o = dropout_options(backend, variant, in.slopes);
        const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        const PaddedBatch p = pad(in);
        Options po = o;
        po.mask = p.mask.view();
        const ForwardResult padded_result = forward(p.q.view(), p.k.view(), p.v.view(), po, Returns{false, true});
        Options no_dropout = o;
        no_dropout.dropout_p = 0;
        const ForwardResult undropped =
            forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, no_dropout, Returns{false, false});
        EXPECT_GT(max_abs_diff(to_float64(packed.output.view()), to_float64(undropped.output.view())), 1e-2)
            << "dropout changed nothing";
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t q0 = in.seqs.cu_seqlens_q[b], q1 = in.seqs.cu_seqlens_q[b + 1];
          const Tensor want = unpadded(padded_result.output, b, q1 - q0);
          const Tensor want_lse = unpadded(padded_result.lse, b, q1 - q0);
          EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.output.view(), q0, q1)), want),
                    same_result_tolerance(dtype, max_abs(want)))
              << "sequence " << b;
          EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.lse.view(), q0, q1)), want_lse),
                    same_result_tolerance(DType::float32, max_abs(want_lse)))
              << "sequence " << b;
        }
      }
}

// backward_varlen replays the forward's dropout: its gradients equal the padded batch's
// (padding rows get dO = 0, so they add nothing to dK, dV).
TEST(Varlen, BackwardWithDropoutMatchesThePaddedBatch) {
  const Lengths& lengths = kSequenceLengths;
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8, B = static_cast<std::int64_t>(lengths.size());
  for (DType dtype : {DType::float32, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (int variant = 0; variant < 2; ++variant) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " variant " << variant);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, 35 + variant);
        in.slopes = alibi_slopes(DType::float32, {B}, Hq, true);
        const Options o = dropout_options(backend, variant, in.slopes);
        std::mt19937_64 rng(variant);
        const Packed dout = packed_random(dtype, Hq, in.seqs.cu_seqlens_q.back(), Ev, rng);
        const ForwardResult fwd = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        const BackwardResult grads = backward_varlen(
            BackwardInputs{in.q.view, in.k.view, in.v.view, fwd.output.view(), fwd.lse.view(), dout.view}, in.seqs, o);
        const PaddedBatch p = pad(in);
        const Tensor dout_padded = padded(dout.view, in.seqs.cu_seqlens_q, p.Lmax);
        Options po = o;
        po.mask = p.mask.view();
        const BackwardResult want = forward_backward(p.q.view(), p.k.view(), p.v.view(), dout_padded.view(), po);
        Options no_dropout = o;
        no_dropout.dropout_p = 0;
        const ForwardResult fwd0 =
            forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, no_dropout, Returns{false, true});
        const BackwardResult undropped = backward_varlen(
            BackwardInputs{in.q.view, in.k.view, in.v.view, fwd0.output.view(), fwd0.lse.view(), dout.view}, in.seqs,
            no_dropout);
        EXPECT_GT(max_abs_diff(to_float64(grads.grad_value.view()), to_float64(undropped.grad_value.view())), 1e-2)
            << "dropout changed nothing";
        for (std::int64_t b = 0; b < B; ++b) {
          const auto [q0, q1, k0, k1] = rows_of(in.seqs, b);
          const Tensor w[] = {unpadded(want.grad_query, b, q1 - q0), unpadded(want.grad_key, b, k1 - k0),
                              unpadded(want.grad_value, b, k1 - k0)};
          const TensorView got[] = {sequence_rows(grads.grad_query.view(), q0, q1),
                                    sequence_rows(grads.grad_key.view(), k0, k1),
                                    sequence_rows(grads.grad_value.view(), k0, k1)};
          for (int g = 0; g < 3; ++g) {
            const double tolerance = (dtype == DType::float64 ? 1e-11 : 1e-5) * std::max(1.0, max_abs(w[g]));
            EXPECT_LE(max_abs_diff(to_float64(got[g]), w[g]), tolerance) << "sequence " << b << " gradient " << g;
          }
        }
      }
}

// backward_varlen's gradients equal backward() on each sequence alone (dK, dV rows of
// sequence b come from sequence b's queries only).
TEST(Varlen, BackwardEqualsBackwardOnEachSequenceAlone) {
  const Lengths& lengths = kSequenceLengths;
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8;
  int n = 0;
  for (DType dtype : {DType::float32, DType::float64})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (int which : {0, 2, 4, 5}) {
        const VarlenOptions& vo = kVarlenOptions[which];
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " backend " << static_cast<int>(backend) << " " << vo.name);
        VarlenInputs in = make_varlen(dtype, Hq, Hkv, E, Ev, lengths, 40 + ++n);
        Options o = options_of(vo, in);
        o.backend = backend;
        std::mt19937_64 rng(n);
        const Packed dout = packed_random(dtype, Hq, in.seqs.cu_seqlens_q.back(), Ev, rng);
        const ForwardResult fwd = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
        const BackwardResult grads = backward_varlen(
            BackwardInputs{in.q.view, in.k.view, in.v.view, fwd.output.view(), fwd.lse.view(), dout.view}, in.seqs, o);
        ASSERT_EQ(grads.grad_query.shape(), in.q.view.shape);
        ASSERT_EQ(grads.grad_key.shape(), in.k.view.shape);
        ASSERT_EQ(grads.grad_value.shape(), in.v.view.shape);
        // The sinks' gradient: (batch, Hq) row b is sequence b's alone; (Hq,) their sum.
        Tensor sink_sums(DType::float64, in.sinks.shape());
        for (std::int64_t b = 0; b < in.batch; ++b) {
          const auto [q0, q1, k0, k1] = rows_of(in.seqs, b);
          const Options ob = sequence_options(o, in, b);
          const BackwardResult alone =
              forward_backward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                               sequence_rows(in.v.view, k0, k1), sequence_rows(dout.view, q0, q1), ob);
          const Tensor* want[] = {&alone.grad_query, &alone.grad_key, &alone.grad_value};
          const TensorView got[] = {sequence_rows(grads.grad_query.view(), q0, q1),
                                    sequence_rows(grads.grad_key.view(), k0, k1),
                                    sequence_rows(grads.grad_value.view(), k0, k1)};
          for (int g = 0; g < 3; ++g) {
            const Tensor w = to_float64(want[g]->view());
            const double tolerance = (dtype == DType::float64 ? 1e-11 : 2e-5) * std::max(1.0, max_abs(w));
            EXPECT_LE(max_abs_diff(to_float64(got[g]), w), tolerance) << "sequence " << b << " gradient " << g;
          }
          for (std::int64_t h = 0; h < Hq && vo.sinks; ++h) {
            const std::int64_t at = vo.sinks == 2 ? b * Hq + h : h;
            sink_sums.set(at, sink_sums.get(at) + alone.grad_sinks.get(h));
          }
        }
        if (vo.sinks) {
          ASSERT_EQ(grads.grad_sinks.shape(), in.sinks.shape());
          EXPECT_LE(max_abs_diff(to_float64(grads.grad_sinks.view()), sink_sums),
                    (dtype == DType::float64 ? 1e-11 : 2e-5) * std::max(1.0, max_abs(sink_sums)));
        }
      }
}

// Long key sequences with a few queries (the shapes the contiguous forward splits over
// keys) packed with short ones.
TEST(Varlen, LongKeySequencesAmongShortOnes) {
  const Lengths lengths = {{2, 5000}, {3, 7}, {1, 3000}, {40, 40}};
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend));
    VarlenInputs in = make_varlen(DType::float32, 4, 1, 16, 8, lengths, 80);
    Options o = options_of(kVarlenOptions[5], in);
    o.window_left = 2500;
    o.backend = backend;
    const ForwardResult packed = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
    for (std::int64_t b = 0; b < in.batch; ++b) {
      const auto [q0, q1, k0, k1] = rows_of(in.seqs, b);
      Options ob = sequence_options(o, in, b);
      ob.backend = Backend::reference;
      const ForwardResult want = forward(sequence_rows(in.q.view, q0, q1), sequence_rows(in.k.view, k0, k1),
                                         sequence_rows(in.v.view, k0, k1), ob, Returns{false, true});
      const Tensor w = to_float64(want.output.view()), wl = to_float64(want.lse.view());
      EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.output.view(), q0, q1)), w),
                1e-5 * std::max(1.0, max_abs(w)))
          << "sequence " << b;
      EXPECT_LE(max_abs_diff(to_float64(sequence_rows(packed.lse.view(), q0, q1)), wl),
                1e-5 * std::max(1.0, max_abs(wl)))
          << "sequence " << b;
    }
  }
}

// The caller-buffer forms write (total, H, D) buffers through permuted strides, the same
// bits as the allocating forms.
TEST(Varlen, CallerBuffersWithPermutedStrides) {
  const Lengths& lengths = kSequenceLengths;
  const std::int64_t Hq = 4, Hkv = 2, E = 16, Ev = 8;
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend));
    VarlenInputs in = make_varlen(DType::float32, Hq, Hkv, E, Ev, lengths, 85);
    Options o = options_of(kVarlenOptions[4], in);
    o.backend = backend;
    const std::int64_t total_q = in.seqs.cu_seqlens_q.back(), total_k = in.seqs.cu_seqlens_k.back();
    const ForwardResult want = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
    std::mt19937_64 rng(3);
    Packed out = packed_random(DType::float32, Hq, total_q, Ev, rng);  // (total, H, Ev) storage
    Tensor lse_storage(DType::float32, {total_q, Hq});
    const TensorView lse{lse_storage.data(), DType::float32, {Hq, total_q}, {1, Hq}};
    forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, ForwardOutputs{out.view, std::nullopt, lse}, o);
    EXPECT_EQ(max_abs_diff(to_float64(out.view), to_float64(want.output.view())), 0.0);
    EXPECT_EQ(max_abs_diff(to_float64(lse), to_float64(want.lse.view())), 0.0);

    const Packed dout = packed_random(DType::float32, Hq, total_q, Ev, rng);
    const BackwardInputs inputs{in.q.view, in.k.view, in.v.view, want.output.view(), want.lse.view(), dout.view};
    const BackwardResult grads = backward_varlen(inputs, in.seqs, o);
    Packed dq = packed_random(DType::float32, Hq, total_q, E, rng),
           dk = packed_random(DType::float32, Hkv, total_k, E, rng),
           dv = packed_random(DType::float32, Hkv, total_k, Ev, rng);
    backward_varlen(inputs, in.seqs, BackwardOutputs{dq.view, dk.view, dv.view, std::nullopt}, o);
    EXPECT_EQ(max_abs_diff(to_float64(dq.view), to_float64(grads.grad_query.view())), 0.0);
    EXPECT_EQ(max_abs_diff(to_float64(dk.view), to_float64(grads.grad_key.view())), 0.0);
    EXPECT_EQ(max_abs_diff(to_float64(dv.view), to_float64(grads.grad_value.view())), 0.0);
    EXPECT_GT(max_abs(grads.grad_key), 1e-3);
  }
}

// A batch of no sequences (cu_seqlens {0}), and a batch whose sequences are all empty:
// correctly shaped, empty or zero results, forward and backward.
TEST(Varlen, EmptyBatchAndEmptySequences) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (const auto& lengths : {Lengths{}, Lengths{{0, 0}, {0, 3}, {2, 0}}}) {
      SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " batch " << lengths.size());
      VarlenInputs in = make_varlen(DType::float32, 2, 1, 4, 3, lengths, 90);
      Options o;
      o.backend = backend;
      o.causal = Causal::bottom_right;
      const ForwardResult r = forward_varlen(in.q.view, in.k.view, in.v.view, in.seqs, o, Returns{false, true});
      const std::int64_t total_q = in.seqs.cu_seqlens_q.back();
      EXPECT_EQ(r.output.shape(), (Shape{2, total_q, 3}));
      for (std::int64_t n = 0; n < r.output.numel(); ++n) EXPECT_EQ(r.output.get(n), 0.0);
      for (std::int64_t n = 0; n < r.lse.numel(); ++n) EXPECT_EQ(r.lse.get(n), -kInf);
      std::mt19937_64 rng(1);
      const Tensor dout = random_tensor(DType::float32, {2, total_q, 3}, rng);
      const BackwardResult g = backward_varlen(
          BackwardInputs{in.q.view, in.k.view, in.v.view, r.output.view(), r.lse.view(), dout.view()}, in.seqs, o);
      EXPECT_EQ(g.grad_key.shape(), in.k.view.shape);
      for (const Tensor* t : {&g.grad_query, &g.grad_key, &g.grad_value})
        for (std::int64_t n = 0; n < t->numel(); ++n) EXPECT_EQ(t->get(n), 0.0);
    }
}

struct VarlenCall {
  Tensor q, k, v, out, lse, weights, mask;
  VarlenSequences seqs{{0, 2, 6}, {0, 5, 8}};
  Options options;
};

VarlenCall valid_varlen_call() {
  std::mt19937_64 rng(1);
  VarlenCall c;
  c.q = random_tensor(DType::float32, {2, 6, 4}, rng);
  c.k = random_tensor(DType::float32, {1, 8, 4}, rng);
  c.v = random_tensor(DType::float32, {1, 8, 3}, rng);
  c.out = Tensor(DType::float32, {2, 6, 3});
  c.lse = Tensor(DType::float32, {2, 6});
  c.weights = Tensor(DType::float32, {2, 6, 8});
  c.mask = Tensor(DType::boolean, {6, 8});
  fill_with_sentinel({&c.out, &c.lse});
  return c;
}

void expect_varlen_rejected(const VarlenCall& c, const std::string& names, bool with_weights = false) {
  const ForwardOutputs outputs = caller_buffers(c.out, c.lse, c.weights, with_weights);
  expect_rejected_naming([&] { forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, outputs, c.options); }, names,
                         {&c.out, &c.lse});
}

TEST(VarlenValidation, ValidCallIsAccepted) {
  VarlenCall c = valid_varlen_call();
  forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, caller_buffers(c.out, c.lse, c.weights, false), c.options);
  EXPECT_FALSE(untouched(c.out));
  EXPECT_FALSE(untouched(c.lse));
}

TEST(VarlenValidation, BadCuSeqlensAreRejectedNamingThem) {
  VarlenCall c = valid_varlen_call();
  c.seqs.cu_seqlens_q = {1, 2, 6};  // does not start at 0
  expect_varlen_rejected(c, "cu_seqlens_q");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_k = {1, 5, 8};
  expect_varlen_rejected(c, "cu_seqlens_k");
  c = valid_varlen_call();
  c.seqs = {{0, 4, 2, 6}, {0, 3, 5, 8}};  // decreasing
  expect_varlen_rejected(c, "cu_seqlens_q");
  c = valid_varlen_call();
  c.seqs = {{0, 2, 4, 6}, {0, 6, 5, 8}};
  expect_varlen_rejected(c, "cu_seqlens_k");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_q = {0, 2, 5};  // does not end at total_q = 6
  expect_varlen_rejected(c, "cu_seqlens_q");
  c.seqs.cu_seqlens_q = {0, 2, 7};
  expect_varlen_rejected(c, "cu_seqlens_q");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_k = {0, 5, 9};  // past total_k = 8
  expect_varlen_rejected(c, "cu_seqlens_k");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_k = {0, 3, 5, 8};  // 3 sequences of keys for 2 of queries
  expect_varlen_rejected(c, "cu_seqlens");
  c = valid_varlen_call();
  c.seqs.cu_seqlens_q = {};  // not even batch + 1 = 1 entry
  expect_varlen_rejected(c, "cu_seqlens_q");
}

TEST(VarlenValidation, MaskWeightsAndSlopesShapeAreRejected) {
  VarlenCall c = valid_varlen_call();
  c.options.mask = c.mask.view();
  expect_varlen_rejected(c, "mask");
  c = valid_varlen_call();
  expect_varlen_rejected(c, "weights", true);
  c = valid_varlen_call();
  const Tensor slopes(DType::float32, {3, 2});  // (batch, Hq) with batch 2 expected
  c.options.alibi_slopes = slopes.view();
  expect_varlen_rejected(c, "alibi_slopes");
  c = valid_varlen_call();
  Returns weights;
  weights.weights = true;
  expect_rejected_naming([&] { forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, c.options, weights); },
                         "weights", {});
}

TEST(VarlenValidation, BackwardRejectsBadCuSeqlensAndWritesNothing) {
  VarlenCall c = valid_varlen_call();
  forward_varlen(c.q.view(), c.k.view(), c.v.view(), c.seqs, caller_buffers(c.out, c.lse, c.weights, false), c.options);
  std::mt19937_64 rng(2);
  const Tensor dout = random_tensor(DType::float32, {2, 6, 3}, rng);
  Tensor dq(DType::float32, {2, 6, 4}), dk(DType::float32, {1, 8, 4}), dv(DType::float32, {1, 8, 3});
  const BackwardInputs inputs{c.q.view(), c.k.view(), c.v.view(), c.out.view(), c.lse.view(), dout.view()};
  const BackwardOutputs outputs{dq.view(), dk.view(), dv.view(), std::nullopt};
  for (const VarlenSequences& bad : {VarlenSequences{{0, 2, 6}, {0, 5, 7}}, VarlenSequences{{0, 3, 2, 6}, {0, 1, 5, 8}},
                                     VarlenSequences{{1, 2, 6}, {0, 5, 8}}}) {
    fill_with_sentinel({&dq, &dk, &dv});
    expect_rejected_naming([&] { backward_varlen(inputs, bad, outputs, c.options); }, "cu_seqlens", {&dq, &dk, &dv});
  }
  fill_with_sentinel({&dq, &dk, &dv});
  backward_varlen(inputs, c.seqs, outputs, c.options);
  EXPECT_FALSE(untouched(dq));
}
}  // namespace
}  // namespace sdpa::testing
