// The ring forward (and the entry point of every exchange's; the ordered one is
// ordered_forward.cpp): N steps; at step s this rank holds the K/V shard of rank r − s,
// computes its queries against it while that shard moves on to rank r + 1 and the next
// one arrives from r − 1, and merges each partial output into its accumulator by the
// log-sum-exp (merge.h). Query pieces go in blocks, with an MPI poll between blocks, so
// that the transfer advances during the compute (exchange.h). The sinks join each row
// once, after the last merge (merge.h's fold_sink): the steps' partial softmaxes carry
// none, or every step would count them again.
//
// Work skipped: a (query block, key piece) pair whose keys the band masks for every
// query of the block (causal, window) is never computed. With the zigzag partition a
// causal call then does the same work on every rank.
#include <time.h>

#include <chrono>
#include <optional>
#include <vector>

#include "api/operands.h"
#include "api/views.h"
#include "cpu/dispatch.h"
#include "dist/agreement.h"
#include "dist/all_gather.h"
#include "dist/exchange.h"
#include "dist/merge.h"
#include "dist/ordered_forward.h"
#include "dist/shards.h"
#include "dist/stats.h"
#include "reference/attention.h"
#include "sdpa/distributed.h"

namespace sdpa::distributed {

namespace detail {

RingStats& last_ring_stats() {
  static RingStats stats;
  return stats;
}

namespace {

constexpr int kForwardTag = 7001;

void run_problem(const Problem& p, Backend backend) {
  if (p.batch * p.heads_q * p.L == 0) return;
  if (backend == Backend::reference)
    sdpa::detail::reference_forward(p);
  else
    sdpa::detail::cpu_forward(&p, 1);
}

// Query rows per block: about eight polls of the exchange per piece, never tiny blocks.
std::int64_t block_rows(std::int64_t rows) { return std::max<std::int64_t>(64, (rows + 7) / 8); }

// Everything the forward allocates by the call's sizes, allocated before the ranks agree
// (agreement.h): memory running out is then an error on every rank, not a rank missing
// from the ring.
template <class Acc>
struct ForwardBuffers {
  std::vector<Acc> acc_out, acc_lse;    // output rows (matrices × Lr × Ev) and lse, accumulated
  std::vector<Acc> part_out, part_lse;  // one query block's partial output and lse
  std::vector<std::byte> buffers[2];    // the K/V shard in hand and the one arriving
  GatheredKv gathered;                  // all-gather: every shard

  explicit ForwardBuffers(const ShardCall& call) {
    const int N = call.ranks;
    const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
    acc_out.assign(static_cast<std::size_t>(matrices * Lr * Ev), Acc{0});
    acc_lse.assign(static_cast<std::size_t>(matrices * Lr), -std::numeric_limits<Acc>::infinity());
    const std::int64_t block = std::min(block_rows(Lr), Lr);
    part_out.resize(static_cast<std::size_t>(matrices * block * Ev));
    part_lse.resize(static_cast<std::size_t>(matrices * block));
    // Two buffers of the largest shard (one for the all-gather: this rank's, packed).
    std::int64_t largest = 0;
    for (int k = 0; k < N; ++k)
      largest = std::max(largest, shard_length(call.sharding.key_length, N, k, call.sharding.partition));
    buffers[0].resize(kv_layout(call, largest, false).total());
    if (call.sharding.exchange == Exchange::ring) buffers[1].resize(buffers[0].size());
    if (call.sharding.exchange == Exchange::all_gather) gathered = plan_gather(call);
  }
};

template <class Acc>
void ring_forward(MPI_Comm comm, const ShardCall& call, const TensorView& query, const TensorView& key,
                  const TensorView& value, const ForwardOutputs& outputs, ForwardBuffers<Acc>& buf) {
  RingStats& stats = last_ring_stats();
  const DType acc_dtype = std::is_same_v<Acc, double> ? DType::float64 : DType::float32;
  const int N = call.ranks, r = call.rank;
  const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
  const std::vector<Piece> q_pieces = shard_pieces(call.sharding.query_length, N, r, call.sharding.partition);
  const GlobalBand band = global_band(call);
  std::vector<Acc>&acc_out = buf.acc_out, &acc_lse = buf.acc_lse, &part_out = buf.part_out, &part_lse = buf.part_lse;
  std::vector<std::byte>* buffers = buf.buffers;
  const std::int64_t block = block_rows(Lr);
  pack_kv(call, key, value, buffers[0].data());

  // All-gather: every shard at once, then the same steps without transfers.
  const bool gather = call.sharding.exchange == Exchange::all_gather;
  GatheredKv& gathered = buf.gathered;
  if (gather) {
    gather_kv(comm, call, buffers[0].data(), gathered);
    stats.bytes_sent += gathered.bytes_sent;
  }

  Transfer exchange(comm, kForwardTag);
  for (int s = 0; s < N; ++s) {
    const int source = (r - s + N) % N;  // whose K/V is in hand
    const std::int64_t S_source = shard_length(call.sharding.key_length, N, source, call.sharding.partition);
    std::byte* hand =
        gather ? gathered.bytes.data() + gathered.offset[static_cast<std::size_t>(source)] : buffers[s % 2].data();
    if (!gather && s + 1 < N) {
      const int next_source = (r - s - 1 + N) % N;
      const std::int64_t S_next = shard_length(call.sharding.key_length, N, next_source, call.sharding.partition);
      exchange.start(hand, kv_layout(call, S_source, false).total(), (r + 1) % N, buffers[(s + 1) % 2].data(),
                     kv_layout(call, S_next, false).total(), (r - 1 + N) % N);
    }
    const Clock::time_point compute_start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    const KvViews kv = kv_views(call, S_source, hand);
    bool computed = false;
    for (const Piece& kp : shard_pieces(call.sharding.key_length, N, source, call.sharding.partition)) {
      for (const Piece& qp : q_pieces)
        for (std::int64_t b0 = 0; b0 < qp.rows; b0 += block) {
          const std::int64_t rows = std::min(block, qp.rows - b0);
          if (kp.rows == 0 || !band.visible(qp.global + b0, rows, kp.global, kp.rows, call.sharding.key_length)) {
            if (kp.rows > 0) ++stats.pieces_skipped;
            continue;
          }
          Problem p = piece_problem(call, band, row_slice(query, qp.local + b0, rows), qp.global + b0, kv, kp.local,
                                    kp.rows, kp.global);
          p.output = sdpa::detail::make_operand(
              packed_view(part_out.data(), acc_dtype, call.batch_shape, call.heads_q, rows, Ev), call.batch_shape,
              call.heads_q);
          TensorView lse_view = packed_view(part_lse.data(), acc_dtype, call.batch_shape, call.heads_q, rows, 1);
          lse_view.shape.pop_back();
          lse_view.strides.pop_back();
          p.lse = sdpa::detail::lse_operand(lse_view, call.batch_shape, call.heads_q);
          run_problem(p, call.options.backend);
          for (std::int64_t m = 0; m < matrices; ++m)
            merge_rows(acc_out.data() + (m * Lr + qp.local + b0) * Ev, acc_lse.data() + m * Lr + qp.local + b0,
                       part_out.data() + m * rows * Ev, part_lse.data() + m * rows, rows, Ev);
          computed = true;
          exchange.poll();
        }
    }
    stats.compute_seconds += seconds_since(compute_start);
    stats.compute_cpu_seconds += thread_cpu_seconds() - cpu_start;
    stats.steps_computed += computed ? 1 : 0;
    const Clock::time_point wait_start = Clock::now();
    exchange.wait();
    stats.wait_seconds += seconds_since(wait_start);
  }
  stats.bytes_sent += exchange.bytes_sent();

  // The sinks, once per row, after the last merge (merge.h).
  if (!call.sinks.empty())
    for (std::int64_t m = 0; m < matrices; ++m)
      fold_sink(acc_out.data() + m * Lr * Ev, acc_lse.data() + m * Lr,
                static_cast<Acc>(call.sinks[static_cast<std::size_t>(m)]), Lr, Ev);

  // This rank's rows of the output (input dtype) and lse.
  const sdpa::detail::Operand out = sdpa::detail::make_operand(outputs.output, call.batch_shape, call.heads_q);
  for (std::int64_t m = 0; m < matrices; ++m)
    for (std::int64_t i = 0; i < Lr; ++i)
      for (std::int64_t d = 0; d < Ev; ++d)
        out.store<Acc>(m, i, d, acc_out[static_cast<std::size_t>((m * Lr + i) * Ev + d)]);
  if (outputs.lse) {
    const sdpa::detail::Operand lse = sdpa::detail::lse_operand(*outputs.lse, call.batch_shape, call.heads_q);
    for (std::int64_t m = 0; m < matrices; ++m)
      for (std::int64_t i = 0; i < Lr; ++i) lse.store<Acc>(m, i, 0, acc_lse[static_cast<std::size_t>(m * Lr + i)]);
  }
}

}  // namespace

}  // namespace detail

void forward(MPI_Comm comm, const TensorView& query, const TensorView& key, const TensorView& value,
             const ForwardOutputs& outputs, const Sharding& sharding, const Options& options) {
  using namespace detail;
  const auto start = std::chrono::steady_clock::now();
  last_ring_stats() = {};
  ShardCall call;
  std::optional<ForwardBuffers<float>> buffers32;
  std::optional<ForwardBuffers<double>> buffers64;
  std::optional<OrderedBuffers<float>> ordered32;  // the ordered exchange's instead
  std::optional<OrderedBuffers<double>> ordered64;
  agree(
      comm,
      [&] {
        call = check_shards(comm, query, key, value, sharding, options);
        if (outputs.weights)
          sdpa::detail::fail("weights", "expected none in a ring call (they would be L × S), got a buffer");
        std::vector<sdpa::detail::ExpectedView> outs{{&outputs.output, "output", &call.output_shape, call.dtype}};
        if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &call.lse_shape, call.lse_dtype});
        sdpa::detail::check_outputs(outs, call.input_spans);
        if (call.sharding.exchange == Exchange::ordered) {
          if (call.dtype == DType::float64)
            ordered64.emplace(call);
          else
            ordered32.emplace(call);
        } else if (call.dtype == DType::float64) {
          buffers64.emplace(call);
        } else {
          buffers32.emplace(call);
        }
        return call.signature;
      },
      "sharding");
  after_agreement(comm, "sdpa::distributed::forward", [&] {
    if (ordered64)
      ordered_forward<double>(comm, call, query, key, value, outputs, *ordered64);
    else if (ordered32)
      ordered_forward<float>(comm, call, query, key, value, outputs, *ordered32);
    else if (buffers64)
      ring_forward<double>(comm, call, query, key, value, outputs, *buffers64);
    else
      ring_forward<float>(comm, call, query, key, value, outputs, *buffers32);
  });
  last_ring_stats().total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace sdpa::distributed
