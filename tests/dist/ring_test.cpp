// Ring attention (sdpa::distributed, src/dist/) against the single-process sdpa::forward
// on the whole sequence. Run under mpirun with 2 and 4 ranks (tests/dist/CMakeLists.txt):
// every rank builds the same global inputs from one seed, runs the single-process call,
// takes its own shard and compares its rows of the ring's result. Tolerances: float64
// within 1e-12 (with dropout this pins the mask bitwise: one key kept or dropped
// differently moves an output by ~p_ij·|v|/(1 − p), far above 1e-12), float32 within
// the float32 rule of DESIGN.md §4 (1e-5 · max(1, max|O|)), bfloat16 against the
// float64 oracle by that rule.
#include <mpi.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "dist/chunks.h"
#include "sdpa/distributed.h"
#include "testing/address_space.h"
#include "testing/helpers.h"

namespace sdpa::distributed {
namespace {

using testing::Shape;

int comm_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int comm_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Rows (dim −2) of `full` that `ranges` name, in order, as one packed tensor.
Tensor gather_rows(const Tensor& full, const std::vector<RowRange>& ranges) {
  Shape shape = full.shape();
  const std::size_t d = shape.size() - 2;
  const std::int64_t rows_full = shape[d], cols = shape.back();
  std::int64_t rows = 0;
  for (const RowRange& r : ranges) rows += r.end - r.begin;
  shape[d] = rows;
  Tensor out(full.dtype(), shape);
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * dtype_size(full.dtype());
  std::int64_t matrices = 1;
  for (std::size_t k = 0; k < d; ++k) matrices *= shape[k];
  auto* dst = static_cast<std::byte*>(out.data());
  const auto* src = static_cast<const std::byte*>(full.data());
  for (std::int64_t m = 0; m < matrices; ++m)
    for (const RowRange& r : ranges)
      for (std::int64_t i = r.begin; i < r.end; ++i, dst += row_bytes)
        std::memcpy(dst, src + static_cast<std::size_t>(m * rows_full + i) * row_bytes, row_bytes);
  return out;
}

struct RingCase {
  DType dtype = DType::float32;
  Shape batch{2};
  std::int64_t Hq = 4, Hkv = 2, L = 37, S = 37, E = 16, Ev = 8;
  Partition partition = Partition::contiguous;
  Exchange exchange = Exchange::ring;
  Options options;
  bool key_padding = false;
  bool alibi = false;
  bool gradients = true;  // also compare the backward
  bool grad_lse = false;  // with a gradient of the lse
  // Attention sinks: none, one per head (Hq,), or one per (batch, head); their dtype. The
  // last head's sink is −inf (no sink) when `no_sink_head`.
  enum class Sinks { none, per_head, per_batch_head } sinks = Sinks::none;
  DType sinks_dtype = DType::float64;
  bool no_sink_head = false;
  // Only rank 0 asks for the sinks' gradient (each rank's outputs are its own choice).
  bool grad_sinks_on_rank_0_only = false;
};

Shape dims(const Shape& batch, std::int64_t h, std::int64_t rows, std::int64_t cols) {
  Shape s = batch;
  s.insert(s.end(), {h, rows, cols});
  return s;
}

// Runs the case on every rank and checks this rank's rows.
void expect_ring_matches(RingCase c) {
  const int N = comm_size(), r = comm_rank();
  std::mt19937_64 rng(1234);  // the same inputs on every rank
  const Tensor q = testing::random_tensor(c.dtype, dims(c.batch, c.Hq, c.L, c.E), rng);
  const Tensor k = testing::random_tensor(c.dtype, dims(c.batch, c.Hkv, c.S, c.E), rng);
  const Tensor v = testing::random_tensor(c.dtype, dims(c.batch, c.Hkv, c.S, c.Ev), rng);
  Tensor padding, slopes;
  Options single = c.options;
  if (c.key_padding) {
    padding = testing::random_bool(dims(c.batch, 1, 1, c.S), rng, 0.7);
    single.mask = padding.view();
  }
  if (c.alibi) {
    slopes = Tensor(DType::float64, {c.Hq});
    for (std::int64_t h = 0; h < c.Hq; ++h) slopes.set(h, 0.5 / static_cast<double>(h + 1));
    single.alibi_slopes = slopes.view();
  }
  Tensor sinks;
  if (c.sinks != RingCase::Sinks::none) {
    Shape shape{c.Hq};
    if (c.sinks == RingCase::Sinks::per_batch_head) shape.insert(shape.begin(), c.batch.begin(), c.batch.end());
    sinks = testing::random_tensor(c.sinks_dtype, shape, rng, 2.0);
    if (c.no_sink_head)
      for (std::int64_t m = c.Hq - 1; m < sinks.numel(); m += c.Hq)
        sinks.set(m, -std::numeric_limits<double>::infinity());
    single.sinks = sinks.view();
  }
  const ForwardResult whole = sdpa::forward(q.view(), k.view(), v.view(), single, {.lse = true});

  const auto q_rows = shard_rows(c.L, N, r, c.partition), k_rows = shard_rows(c.S, N, r, c.partition);
  const Tensor q_shard = gather_rows(q, q_rows), k_shard = gather_rows(k, k_rows), v_shard = gather_rows(v, k_rows);
  Options ring = c.options;
  Tensor padding_shard;
  if (c.key_padding) {
    // The mask's keys are its last dim: its transpose's rows.
    padding_shard = Tensor(DType::boolean, dims(c.batch, 1, 1, shard_length(c.S, N, r, c.partition)));
    std::int64_t batch = 1;
    for (std::int64_t b : c.batch) batch *= b;
    auto* dst = static_cast<bool*>(padding_shard.data());
    const auto* src = static_cast<const bool*>(padding.data());
    for (std::int64_t b = 0; b < batch; ++b)
      for (const RowRange& range : k_rows)
        for (std::int64_t j = range.begin; j < range.end; ++j) *dst++ = src[b * c.S + j];
    ring.mask = padding_shard.view();
  }
  if (c.alibi) ring.alibi_slopes = slopes.view();
  if (c.sinks != RingCase::Sinks::none) ring.sinks = sinks.view();
  Tensor out(c.dtype, dims(c.batch, c.Hq, shard_length(c.L, N, r, c.partition), c.Ev));
  Tensor lse(c.dtype == DType::float64 ? DType::float64 : DType::float32,
             Shape(out.shape().begin(), out.shape().end() - 1));
  forward(MPI_COMM_WORLD, q_shard.view(), k_shard.view(), v_shard.view(), {out.view(), std::nullopt, lse.view()},
          {c.L, c.S, c.partition, c.exchange}, ring);

  const Tensor expected_out = gather_rows(whole.output, q_rows);
  Tensor whole_lse_as_rows = whole.lse;  // (…, L) seen as (…, L, 1)
  {
    Shape s = whole.lse.shape();
    s.push_back(1);
    Tensor t(whole.lse.dtype(), s);
    std::memcpy(t.data(), whole.lse.data(), whole.lse.nbytes());
    whole_lse_as_rows = gather_rows(t, q_rows);
  }
  Tensor lse_rows(lse.dtype(), whole_lse_as_rows.shape());
  // An empty shard (fewer rows than 2N chunks) has no memory to copy: memcpy's pointers
  // must not be null even for 0 bytes (UBSan).
  if (lse.nbytes() > 0) std::memcpy(lse_rows.data(), lse.data(), lse.nbytes());

  // The ordered exchange in float64 on the CPU backend: the single-process bytes.
  if (c.exchange == Exchange::ordered && c.dtype == DType::float64 && c.options.backend != Backend::reference) {
    ASSERT_EQ(out.nbytes(), expected_out.nbytes());
    ASSERT_EQ(lse_rows.nbytes(), whole_lse_as_rows.nbytes());
    EXPECT_TRUE(out.nbytes() == 0 || std::memcmp(out.data(), expected_out.data(), out.nbytes()) == 0)
        << "output, rank " << r << " of " << N << ": not bitwise the single-process output";
    EXPECT_TRUE(lse_rows.nbytes() == 0 ||
                std::memcmp(lse_rows.data(), whole_lse_as_rows.data(), lse_rows.nbytes()) == 0)
        << "lse, rank " << r << " of " << N << ": not bitwise the single-process lse";
  }

  double tol_out = 0, tol_lse = 0;
  if (c.dtype == DType::float64) {
    tol_out = tol_lse = 1e-12;
  } else if (c.dtype == DType::float32) {
    tol_out = 1e-5 * std::max(1.0, testing::max_abs(whole.output));
    tol_lse = 1e-5 * std::max(1.0, testing::max_abs(whole.lse));
  } else {
    // Both results round float32 sums once to bfloat16/float16: within two units of the
    // last place of the output's scale.
    const double ulp = c.dtype == DType::bfloat16 ? 1.0 / 128 : 1.0 / 1024;
    tol_out = 2 * ulp * std::max(1.0, testing::max_abs(whole.output));
    tol_lse = 1e-5 * std::max(1.0, testing::max_abs(whole.lse));
  }
  EXPECT_LE(testing::max_abs_diff(testing::to_float64(out.view()), testing::to_float64(expected_out.view())), tol_out)
      << "rank " << r << " of " << N;
  EXPECT_LE(testing::max_abs_diff(testing::to_float64(lse_rows.view()), testing::to_float64(whole_lse_as_rows.view())),
            tol_lse)
      << "rank " << r << " of " << N;
  if (!c.gradients) return;

  // Backward: the whole problem's gradients from sdpa::backward, with a random dO (and a
  // random dlse: the loss also depends on the lse), against the ring's from this rank's
  // rows of the ring forward's O and lse.
  const Tensor grad_out = testing::random_tensor(c.dtype, whole.output.shape(), rng);
  const Tensor grad_lse = testing::random_tensor(whole.lse.dtype(), whole.lse.shape(), rng, 0.5);
  BackwardInputs whole_in{q.view(), k.view(), v.view(), whole.output.view(), whole.lse.view(), grad_out.view()};
  if (c.grad_lse) whole_in.grad_lse = grad_lse.view();
  const BackwardResult expected = sdpa::backward(whole_in, single);

  const Tensor grad_out_shard = gather_rows(grad_out, q_rows);
  Tensor grad_lse_shard(lse.dtype(), lse.shape());
  {
    Shape s = grad_lse.shape();
    s.push_back(1);
    Tensor t(grad_lse.dtype(), s);
    std::memcpy(t.data(), grad_lse.data(), grad_lse.nbytes());
    const Tensor rows = gather_rows(t, q_rows);
    if (rows.nbytes() > 0) std::memcpy(grad_lse_shard.data(), rows.data(), rows.nbytes());  // as lse_rows above
  }
  BackwardInputs ring_in{q_shard.view(), k_shard.view(), v_shard.view(), out.view(), lse.view(), grad_out_shard.view()};
  if (c.grad_lse) ring_in.grad_lse = grad_lse_shard.view();
  Tensor dq(c.dtype, q_shard.shape()), dk(c.dtype, k_shard.shape()), dv(c.dtype, v_shard.shape());
  BackwardOutputs ring_grads{dq.view(), dk.view(), dv.view(), std::nullopt};
  Tensor dsinks;
  const bool wants_dsinks = c.sinks != RingCase::Sinks::none && (r == 0 || !c.grad_sinks_on_rank_0_only);
  if (wants_dsinks) {
    dsinks = Tensor(sinks.dtype(), sinks.shape());
    ring_grads.grad_sinks = dsinks.view();
  }
  backward(MPI_COMM_WORLD, ring_in, ring_grads, {c.L, c.S, c.partition, c.exchange}, ring);
  if (wants_dsinks) {
    // Summed over every rank's rows: the whole tensor on every rank.
    const double scale = std::max(1.0, testing::max_abs(expected.grad_sinks));
    const double tol = c.dtype == DType::float64 ? 1e-12 * scale : 1e-4 * scale;
    EXPECT_LE(
        testing::max_abs_diff(testing::to_float64(dsinks.view()), testing::to_float64(expected.grad_sinks.view())), tol)
        << "dsinks, rank " << r << " of " << N;
  }

  const std::pair<const Tensor*, Tensor> pairs[] = {{&dq, gather_rows(expected.grad_query, q_rows)},
                                                    {&dk, gather_rows(expected.grad_key, k_rows)},
                                                    {&dv, gather_rows(expected.grad_value, k_rows)}};
  const char* names[] = {"dQ", "dK", "dV"};
  for (int g = 0; g < 3; ++g) {
    const double scale = std::max(1.0, testing::max_abs(pairs[g].second));
    const double tol = c.dtype == DType::float64   ? 1e-12 * scale
                       : c.dtype == DType::float32 ? 1e-4 * scale
                                                   : 4.0 / 128 * scale;
    EXPECT_LE(
        testing::max_abs_diff(testing::to_float64(pairs[g].first->view()), testing::to_float64(pairs[g].second.view())),
        tol)
        << names[g] << ", rank " << r << " of " << N;
  }
}

RingCase causal_case(Causal causal, Partition partition, std::int64_t L, std::int64_t S) {
  RingCase c;
  c.partition = partition;
  c.L = L;
  c.S = S;
  c.options.causal = causal;
  return c;
}

TEST(Ring, FullAttentionContiguousGqaLengthNotDivisible) { expect_ring_matches(RingCase{}); }

TEST(Ring, FullAttentionZigzagLongerKeys) {
  RingCase c;
  c.partition = Partition::zigzag;
  c.S = 61;
  c.grad_lse = true;
  expect_ring_matches(c);
}

TEST(Ring, CausalTopLeftZigzagDivisible) {
  expect_ring_matches(causal_case(Causal::top_left, Partition::zigzag, 64, 64));
}
TEST(Ring, CausalTopLeftZigzagNotDivisible) {
  expect_ring_matches(causal_case(Causal::top_left, Partition::zigzag, 45, 45));
}
TEST(Ring, CausalTopLeftContiguous) {
  expect_ring_matches(causal_case(Causal::top_left, Partition::contiguous, 45, 45));
}
TEST(Ring, CausalTopLeftMoreKeysThanQueries) {
  expect_ring_matches(causal_case(Causal::top_left, Partition::zigzag, 29, 47));
}
TEST(Ring, CausalBottomRightZigzag) {
  expect_ring_matches(causal_case(Causal::bottom_right, Partition::zigzag, 29, 47));
}
TEST(Ring, CausalBottomRightMoreQueriesThanKeys) {
  // Queries before the first key's diagonal see nothing: lse −inf, output 0, merged as such.
  expect_ring_matches(causal_case(Causal::bottom_right, Partition::contiguous, 47, 29));
}

TEST(Ring, SlidingWindowZigzag) {
  RingCase c = causal_case(Causal::none, Partition::zigzag, 50, 50);
  c.options.window_left = 5;
  c.options.window_right = 3;
  expect_ring_matches(c);
}

TEST(Ring, CausalWindowAlibiSoftcapFloat64) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 53, 53);
  c.dtype = DType::float64;
  c.options.window_left = 9;
  c.options.softcap = 2.5;
  c.alibi = true;
  c.grad_lse = true;
  expect_ring_matches(c);
}

TEST(Ring, DropoutMaskBitwiseSingleProcessFloat64) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 45, 45);
  c.dtype = DType::float64;
  c.options.dropout_p = 0.3;
  c.options.seed = 99;
  c.options.offset = 5;
  expect_ring_matches(c);
}

TEST(Ring, DropoutNonCausalContiguousFloat32) {
  RingCase c;
  c.options.dropout_p = 0.5;
  c.options.seed = 3;
  expect_ring_matches(c);
}

TEST(Ring, KeyPaddingMaskTravelsWithItsShard) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 40, 40);
  c.key_padding = true;
  expect_ring_matches(c);
}

TEST(Ring, ShorterThanTwoChunksPerRank) {
  // Some ranks hold no rows at all (L = 3 < 2N): they still pass K/V along.
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 3, 3);
  c.dtype = DType::float64;
  expect_ring_matches(c);
}

TEST(Ring, Bfloat16MergedInFloat32) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 64, 64);
  c.dtype = DType::bfloat16;
  c.E = 32;
  c.Ev = 32;
  expect_ring_matches(c);
}

TEST(Ring, ReferenceBackend) {
  RingCase c = causal_case(Causal::bottom_right, Partition::zigzag, 21, 33);
  c.dtype = DType::float64;
  c.options.backend = Backend::reference;
  c.gradients = false;  // refused: RingErrors.ReferenceBackward
  expect_ring_matches(c);
}

TEST(Ring, AllGatherCausalGqaFloat64) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 45, 45);
  c.dtype = DType::float64;
  c.exchange = Exchange::all_gather;
  c.grad_lse = true;
  expect_ring_matches(c);
}

TEST(RingAllGather, KeyPaddingDropoutContiguousFloat32) {
  RingCase c;
  c.exchange = Exchange::all_gather;
  c.key_padding = true;
  c.options.dropout_p = 0.2;
  c.options.seed = 4;
  expect_ring_matches(c);
}

// A rank's outputs are its own choice: rank 0 alone asks for the sinks' gradient, the
// others still join its sum over the ranks (before the fix only the ranks that asked
// entered the MPI_Allreduce, and rank 0 waited there for ever).
TEST(RingErrors, GradSinksOnOneRankOnly) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 45, 45);
  c.sinks = RingCase::Sinks::per_head;
  c.grad_sinks_on_rank_0_only = true;
  expect_ring_matches(c);
}

// Attention sinks join each row's softmax once, after the ring's last merge: the output,
// the lse (which contains them) and every gradient, the sinks' own summed over the ranks,
// equal the single-process call's.
TEST(RingSinks, CausalZigzagFloat64) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 45, 45);
  c.dtype = DType::float64;
  c.sinks = RingCase::Sinks::per_head;
  c.no_sink_head = true;
  c.grad_lse = true;
  expect_ring_matches(c);
}

TEST(RingSinks, PerBatchHeadContiguousFloat32) {
  RingCase c;  // full attention, GQA, L not divisible by N
  c.sinks = RingCase::Sinks::per_batch_head;
  c.sinks_dtype = DType::float32;
  c.grad_lse = true;
  expect_ring_matches(c);
}

TEST(RingSinks, CausalZigzagFloat32) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 64, 64);
  c.sinks = RingCase::Sinks::per_head;
  expect_ring_matches(c);
}

TEST(RingSinks, RowsWithoutVisibleKeysGetLseSink) {
  // Bottom-right with L > S: the first L − S queries see no key (output 0, lse = sink),
  // and some ranks hold only such rows.
  RingCase c = causal_case(Causal::bottom_right, Partition::contiguous, 47, 29);
  c.dtype = DType::float64;
  c.sinks = RingCase::Sinks::per_batch_head;
  c.grad_lse = true;
  expect_ring_matches(c);
}

TEST(RingSinks, WindowAllGatherFloat64) {
  RingCase c = causal_case(Causal::none, Partition::zigzag, 50, 50);
  c.dtype = DType::float64;
  c.exchange = Exchange::all_gather;
  c.options.window_left = 4;
  c.options.window_right = 2;
  c.sinks = RingCase::Sinks::per_head;
  expect_ring_matches(c);
}

// The ordered exchange: float64 bitwise the single-process sdpa::forward (checked in
// expect_ring_matches), at lengths divisible by neither 2N nor the kernel's key tile of
// 64, some shorter than 64 · 2N (chunks astride several owners), some with empty shards.
RingCase ordered_case(Causal causal, Partition partition, std::int64_t L, std::int64_t S) {
  RingCase c = causal_case(causal, partition, L, S);
  c.dtype = DType::float64;
  c.exchange = Exchange::ordered;
  return c;
}

TEST(RingOrdered, CausalTopLeftZigzagBitwise) {
  expect_ring_matches(ordered_case(Causal::top_left, Partition::zigzag, 301, 301));
}
TEST(RingOrdered, CausalTopLeftContiguousBitwise) {
  expect_ring_matches(ordered_case(Causal::top_left, Partition::contiguous, 203, 203));
}
TEST(RingOrdered, CausalBottomRightZigzagBitwise) {
  RingCase c = ordered_case(Causal::bottom_right, Partition::zigzag, 131, 205);
  c.grad_lse = true;
  expect_ring_matches(c);
}
TEST(RingOrdered, CausalBottomRightMoreQueriesThanKeysBitwise) {
  expect_ring_matches(ordered_case(Causal::bottom_right, Partition::contiguous, 150, 77));
}
TEST(RingOrdered, FullAttentionGqaShortBitwise) {
  // Shorter than one tile: one chunk filled by every rank.
  expect_ring_matches(ordered_case(Causal::none, Partition::zigzag, 37, 61));
}
TEST(RingOrdered, FullAttentionContiguousLongBitwise) {
  RingCase c = ordered_case(Causal::none, Partition::contiguous, 90, 333);
  c.Hq = 5;
  c.Hkv = 1;  // MQA
  expect_ring_matches(c);
}
TEST(RingOrdered, WindowAlibiSoftcapBitwise) {
  RingCase c = ordered_case(Causal::top_left, Partition::zigzag, 260, 260);
  c.options.window_left = 70;
  c.options.softcap = 2.5;
  c.alibi = true;
  expect_ring_matches(c);
}
TEST(RingOrdered, TwoSidedWindowBitwise) {
  RingCase c = ordered_case(Causal::none, Partition::contiguous, 199, 199);
  c.options.window_left = 20;
  c.options.window_right = 90;
  expect_ring_matches(c);
}
TEST(RingOrdered, DropoutBitwise) {
  RingCase c = ordered_case(Causal::top_left, Partition::zigzag, 190, 190);
  c.options.dropout_p = 0.3;
  c.options.seed = 99;
  c.options.offset = 5;
  expect_ring_matches(c);
}
TEST(RingOrdered, KeyPaddingMaskBitwise) {
  RingCase c = ordered_case(Causal::top_left, Partition::contiguous, 150, 150);
  c.key_padding = true;
  expect_ring_matches(c);
}
TEST(RingOrdered, SinksFoldedOnceBitwise) {
  RingCase c = ordered_case(Causal::bottom_right, Partition::zigzag, 100, 140);
  c.sinks = RingCase::Sinks::per_batch_head;
  c.no_sink_head = true;
  c.grad_lse = true;  // the backward (the ring's) with the sinks' gradient
  expect_ring_matches(c);
}
TEST(RingOrdered, RowsWithoutVisibleKeysGetLseSinkBitwise) {
  RingCase c = ordered_case(Causal::bottom_right, Partition::contiguous, 150, 77);
  c.sinks = RingCase::Sinks::per_head;
  expect_ring_matches(c);
}
TEST(RingOrdered, EmptyShardsBitwise) { expect_ring_matches(ordered_case(Causal::top_left, Partition::zigzag, 3, 3)); }
TEST(RingOrdered, Float32MergedByLse) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 150, 150);
  c.exchange = Exchange::ordered;
  c.key_padding = true;
  expect_ring_matches(c);
}
TEST(RingOrdered, Float32SinksFoldedOnce) {
  RingCase c = causal_case(Causal::none, Partition::contiguous, 70, 90);
  c.exchange = Exchange::ordered;
  c.sinks = RingCase::Sinks::per_head;
  c.sinks_dtype = DType::float32;
  expect_ring_matches(c);
}
TEST(RingOrdered, Bfloat16MergedInFloat32) {
  RingCase c = causal_case(Causal::top_left, Partition::zigzag, 64, 64);
  c.dtype = DType::bfloat16;
  c.exchange = Exchange::ordered;
  c.E = 32;
  c.Ev = 32;
  expect_ring_matches(c);
}
TEST(RingOrdered, ReferenceBackendMerged) {
  RingCase c = ordered_case(Causal::bottom_right, Partition::zigzag, 21, 133);
  c.options.backend = Backend::reference;
  c.gradients = false;
  expect_ring_matches(c);
}

TEST(RingOrdered, ChunksCoverEveryKeyOnceAtTileMultiples) {
  for (int N : {1, 2, 3, 4, 7})
    for (std::int64_t n : {0, 1, 5, 63, 64, 65, 200, 1000})
      for (Partition p : {Partition::contiguous, Partition::zigzag}) {
        std::int64_t next = 0;
        for (const detail::Chunk& chunk : detail::ordered_chunks(n, N, p, 64)) {
          EXPECT_EQ(chunk.begin, next) << "N " << N << ", n " << n;
          EXPECT_EQ(chunk.begin % 64, 0) << "N " << N << ", n " << n;
          EXPECT_LT(chunk.begin, chunk.end);
          for (const detail::Segment& s : chunk.segments) {
            EXPECT_EQ(s.global, next) << "segments in key order, none missing";
            // The owner's shard holds global key s.global at its row s.local.
            std::int64_t local = 0;
            bool found = false;
            for (const RowRange& range : shard_rows(n, N, s.owner, p)) {
              if (s.global >= range.begin && s.global + s.rows <= range.end) {
                EXPECT_EQ(s.local, local + s.global - range.begin);
                found = true;
              }
              local += range.end - range.begin;
            }
            EXPECT_TRUE(found) << "segment not inside one piece of its owner";
            next += s.rows;
          }
          EXPECT_EQ(next, chunk.end);
        }
        EXPECT_EQ(next, n);
      }
}

// `call` fails on this rank with an sdpa::Error naming `argument` whose message holds
// `says`; where one rank is at fault (`culprit` >= 0), the others' messages say which.
template <class Call>
void expect_error_on_every_rank(const Call& call, const std::string& argument, const std::string& says = "",
                                int culprit = -1) {
  const int r = comm_rank();
  try {
    call();
    ADD_FAILURE() << "rank " << r << ": no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.argument(), argument) << what;
    EXPECT_NE(what.find(says), std::string::npos) << what;
    if (culprit >= 0 && r != culprit) {
      EXPECT_NE(what.find("(on rank " + std::to_string(culprit) + ")"), std::string::npos) << what;
    }
  }
}

// A rank whose shard disagrees with the partition: every rank raises, none waits.
TEST(RingErrors, BadShardOnOneRankFailsEveryRank) {
  const int N = comm_size(), r = comm_rank();
  const std::int64_t L = 8 * N;
  const std::int64_t rows = L / N + (r == N - 1 ? 1 : 0);  // the last rank's query is a row too long
  Tensor q(DType::float32, {2, rows, 8}), k(DType::float32, {2, L / N, 8}), v(DType::float32, {2, L / N, 8});
  Tensor out(DType::float32, {2, rows, 8});
  expect_error_on_every_rank(
      [&] {
        forward(MPI_COMM_WORLD, q.view(), k.view(), v.view(), {out.view(), std::nullopt, std::nullopt},
                {L, L, Partition::contiguous});
      },
      "query", "expected 8 rows", N - 1);
}

TEST(RingErrors, RanksDisagreeOnOptions) {
  const int N = comm_size(), r = comm_rank();
  const std::int64_t L = 4 * N;
  Tensor q(DType::float32, {2, L / N, 8}), k(DType::float32, {2, L / N, 8}), v(DType::float32, {2, L / N, 8});
  Tensor out(DType::float32, {2, L / N, 8});
  Options options;
  options.seed = static_cast<std::uint64_t>(r == 0 ? 1 : 2);
  options.dropout_p = 0.1;
  expect_error_on_every_rank(
      [&] {
        forward(MPI_COMM_WORLD, q.view(), k.view(), v.view(), {out.view(), std::nullopt, std::nullopt},
                {L, L, Partition::zigzag}, options);
      },
      "sharding", "same call on every rank");
}

// Sinks are part of the call every rank must agree on: one rank's different sinks are
// an error on every rank, before any exchange.
TEST(RingErrors, SinksDifferOnOneRank) {
  const int N = comm_size(), r = comm_rank();
  const std::int64_t L = 4 * N;
  Tensor q(DType::float32, {2, L / N, 8}), k(DType::float32, {2, L / N, 8}), v(DType::float32, {2, L / N, 8});
  Tensor out(DType::float32, {2, L / N, 8}), sinks(DType::float32, {1});  // rank 3: one head
  sinks.set(0, r == N - 1 ? 1.5 : 1.0);
  Options options;
  options.sinks = sinks.view();
  expect_error_on_every_rank(
      [&] {
        forward(MPI_COMM_WORLD, q.view(), k.view(), v.view(), {out.view(), std::nullopt, std::nullopt},
                {L, L, Partition::zigzag}, options);
      },
      "sharding", "same call on every rank");
}

// Memory running out on one rank while the ring's buffers are allocated: they are
// allocated before the agreement, so every rank raises (the others "(on rank k)")
// instead of waiting in the ring for a rank that has gone. The test limits its own
// address space on the last rank (setrlimit), no hook in the library; K and V are
// stride-0 views (one row in memory, 2^20 rows long), the ring's K/V buffers are real.
TEST(RingErrors, MemoryRunningOutOnOneRankFailsEveryRank) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot be set";
#else
  const int N = comm_size(), r = comm_rank();
  const std::int64_t rows = std::int64_t{1} << 20, E = 16;  // 2^20 × 16 × 2 × 4 bytes = 128 MiB per K/V buffer
  const std::int64_t L = 2 * N, S = rows * N;
  Tensor q(DType::float32, {1, 2, E}), out(DType::float32, {1, 2, E}), row(DType::float32, {E});
  TensorView k{row.data(), DType::float32, {1, rows, E}, {0, 0, 1}};
  const TensorView& v = k;
  const bool limited = r == N - 1;
  bool raised = false;
  std::string what;
  {
    // What the process maps now, and 64 MiB more: less than one K/V buffer.
    std::optional<testing::AddressSpaceCap> cap;
    if (limited) {
      cap.emplace(std::uint64_t{64} << 20);
      ASSERT_TRUE(cap->active());
    }
    try {
      forward(MPI_COMM_WORLD, q.view(), k, v, {out.view(), std::nullopt, std::nullopt}, {L, S, Partition::zigzag});
    } catch (const Error& e) {
      raised = true;
      what = e.what();
    }
  }
  EXPECT_TRUE(raised) << "rank " << r << ": no error";
  if (!limited) {
    EXPECT_NE(what.find("(on rank " + std::to_string(N - 1) + ")"), std::string::npos) << what;
  }
#endif
}

// int8 K/V (quantized caches) are a single-process feature: refused on every rank,
// naming the key, even when only one rank's key is int8 (the others' are float32).
TEST(RingErrors, Int8KeyRefusedOnEveryRank) {
  const int N = comm_size(), r = comm_rank();
  const std::int64_t L = 4 * N;
  const bool culprit = r == N - 1;
  Tensor q(DType::float32, {2, L / N, 8}), k(culprit ? DType::int8 : DType::float32, {2, L / N, 8});
  Tensor v(DType::float32, {2, L / N, 8}), out(DType::float32, {2, L / N, 8});
  Tensor scale(DType::float32, {2, L / N});
  Options options;
  if (culprit) options.key_scale = scale.view();
  expect_error_on_every_rank(
      [&] {
        forward(MPI_COMM_WORLD, q.view(), k.view(), v.view(), {out.view(), std::nullopt, std::nullopt},
                {L, L, Partition::zigzag}, options);
      },
      "key", "int8 is not supported by ring attention", N - 1);
}

TEST(RingErrors, ReferenceBackward) {
  const int N = comm_size();
  const std::int64_t L = 4 * N;
  Tensor q(DType::float64, {2, L / N, 8}), k(DType::float64, {2, L / N, 8}), v(DType::float64, {2, L / N, 8});
  Tensor out(DType::float64, {2, L / N, 8}), lse(DType::float64, {2, L / N});
  Tensor dq(DType::float64, {2, L / N, 8}), dk(DType::float64, {2, L / N, 8}), dv(DType::float64, {2, L / N, 8});
  Options options;
  options.backend = Backend::reference;
  expect_error_on_every_rank(
      [&] {
        backward(MPI_COMM_WORLD, {q.view(), k.view(), v.view(), out.view(), lse.view(), out.view()},
                 {dq.view(), dk.view(), dv.view(), std::nullopt}, {L, L, Partition::contiguous}, options);
      },
      "options.backend");
}

TEST(RingPartition, EveryRowOnceWhateverTheLength) {
  for (int N : {1, 2, 3, 4, 7})
    for (std::int64_t n : {0, 1, 5, 16, 37, 1000})
      for (Partition p : {Partition::contiguous, Partition::zigzag}) {
        std::vector<int> owner(static_cast<std::size_t>(n), -1);
        for (int r = 0; r < N; ++r)
          for (const RowRange& range : shard_rows(n, N, r, p))
            for (std::int64_t i = range.begin; i < range.end; ++i) {
              EXPECT_EQ(owner[static_cast<std::size_t>(i)], -1) << "row " << i << " twice";
              owner[static_cast<std::size_t>(i)] = r;
            }
        for (std::int64_t i = 0; i < n; ++i) EXPECT_GE(owner[static_cast<std::size_t>(i)], 0) << "row " << i << " lost";
      }
  // Zigzag: rank r holds chunks r and 2N − 1 − r.
  const auto rows = shard_rows(16, 4, 1, Partition::zigzag);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].begin, 2);
  EXPECT_EQ(rows[0].end, 4);
  EXPECT_EQ(rows[1].begin, 12);
  EXPECT_EQ(rows[1].end, 14);
}

}  // namespace
}  // namespace sdpa::distributed

namespace {

// What ranks other than 0 print: their failed assertions, each with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

// MPI around GoogleTest: every rank runs every test (they are collective), rank 0
// prints the report, the others their failures, and every rank exits non-zero when a
// test failed on any rank.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "rank %d: a test failed\n", rank);
  MPI_Finalize();
  return any;
}
