// The ordered exchange's forward: the key chunks (chunks.h) in global order, each
// broadcast by its owner(s) while the chunk before it is computed (double buffering,
// polled between query blocks as the ring is). For float64 on the CPU backend every
// query row's online-softmax state (max, sum, un-normalised output) is carried from one
// chunk to the next through the portable kernel's resumable call (Problem::carried) and
// finished once at the end: the arithmetic of one single-process call, tile for tile, so
// the output and lse are bitwise sdpa::forward's (the sinks folded by the kernel's own
// ending). Otherwise (float32, bfloat16, float16 on the SIMD kernels; the reference
// backend) each chunk's partial output merges by its log-sum-exp, as the ring's do, and
// the sinks fold once after the last chunk (merge.h).
//
// Work skipped as in the ring: a (query block, chunk) pair whose keys the band masks for
// every query of the block is not computed. Within a row's visible range a fully masked
// tile changes no bit of its state (α = 1, sum + 0), so skipping or not is invisible.
#include "dist/ordered_forward.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <type_traits>
#include <vector>

#include "api/operands.h"
#include "cpu/dispatch.h"
#include "cpu/portable/kernels.h"
#include "dist/chunks.h"
#include "dist/exchange.h"
#include "dist/merge.h"
#include "dist/stats.h"
#include "reference/attention.h"

namespace sdpa::distributed::detail {

namespace {

// Query rows per block: about eight polls of the exchange per chunk, never tiny blocks.
std::int64_t block_rows(std::int64_t rows) { return std::max<std::int64_t>(64, (rows + 7) / 8); }

void run_problem(const Problem& p, Backend backend) {
  if (p.batch * p.heads_q * p.L == 0) return;
  if (backend == Backend::reference)
    sdpa::detail::reference_forward(p);
  else
    sdpa::detail::cpu_forward(&p, 1);
}

sdpa::detail::Operand lse_operand(const ShardCall& call, TensorView view) {
  return sdpa::detail::lse_operand(view, call.batch_shape, call.heads_q);
}

// Whether the CPU backend's kernel for this dtype resumes from Problem::carried.
template <class Acc>
bool carries(const ShardCall& call) {
  return call.options.backend != Backend::reference && sdpa::detail::cpu_forward_resumable(std::is_same_v<Acc, double>);
}

}  // namespace

template <class Acc>
OrderedBuffers<Acc>::OrderedBuffers(const ShardCall& call) {
  const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
  chunks = ordered_chunks(call.sharding.key_length, call.ranks, call.sharding.partition,
                          sdpa::detail::kPortableKeyTile);
  if (carries<Acc>(call)) {
    state.assign(static_cast<std::size_t>(matrices * Lr * (Ev + 2)), Acc{0});
    for (std::size_t row = 0; row < static_cast<std::size_t>(matrices * Lr); ++row)
      state[row * static_cast<std::size_t>(Ev + 2)] = -std::numeric_limits<Acc>::infinity();
  } else {
    const std::int64_t block = std::min(block_rows(Lr), Lr);
    acc_out.assign(static_cast<std::size_t>(matrices * Lr * Ev), Acc{0});
    acc_lse.assign(static_cast<std::size_t>(matrices * Lr), -std::numeric_limits<Acc>::infinity());
    part_out.resize(static_cast<std::size_t>(matrices * block * Ev));
    part_lse.resize(static_cast<std::size_t>(matrices * block));
  }
  own.resize(kv_layout(call, call.S_shard, false).total());
  std::int64_t largest = 0;
  for (const Chunk& chunk : chunks) largest = std::max(largest, chunk.end - chunk.begin);
  hand.resize(kv_layout(call, largest, false).total());
  for (auto& buffer : arriving) buffer.resize(hand.size());  // a chunk's segments fill as many bytes
}

template <class Acc>
void ordered_forward(MPI_Comm comm, const ShardCall& call, const TensorView& query, const TensorView& key,
                     const TensorView& value, const ForwardOutputs& outputs, OrderedBuffers<Acc>& buf) {
  RingStats& stats = last_ring_stats();
  const DType acc_dtype = std::is_same_v<Acc, double> ? DType::float64 : DType::float32;
  const int N = call.ranks, r = call.rank;
  const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
  const std::int64_t S = call.sharding.key_length;
  const std::vector<Piece> q_pieces = shard_pieces(call.sharding.query_length, N, r, call.sharding.partition);
  const GlobalBand band = global_band(call);
  const bool carry = carries<Acc>(call);
  const std::vector<Chunk>& chunks = buf.chunks;
  const std::int64_t block = block_rows(Lr);
  pack_kv(call, key, value, buf.own.data());

  Transfer exchange(comm, 0);
  const auto start = [&](const Chunk& chunk, std::byte* into) {
    for (const Segment& segment : chunk.segments) {
      if (segment.owner == r)
        copy_kv_rows(call, buf.own.data(), call.S_shard, segment.local, into, segment.rows, 0, segment.rows);
      const std::size_t bytes = kv_layout(call, segment.rows, false).total();
      exchange.broadcast(into, bytes, segment.owner);
      into += bytes;
    }
  };
  const auto assemble = [&](const Chunk& chunk, const std::byte* from) {
    for (const Segment& segment : chunk.segments) {
      copy_kv_rows(call, from, segment.rows, 0, buf.hand.data(), chunk.end - chunk.begin, segment.global - chunk.begin,
                   segment.rows);
      from += kv_layout(call, segment.rows, false).total();
    }
  };

  if (!chunks.empty()) {
    const Clock::time_point wait_start = Clock::now();
    start(chunks[0], buf.arriving[0].data());  // nothing to overlap the first chunk with
    exchange.wait();
    stats.wait_seconds += seconds_since(wait_start);
  }
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& chunk = chunks[c];
    const std::int64_t rows_in_chunk = chunk.end - chunk.begin;
    assemble(chunk, buf.arriving[c % 2].data());
    if (c + 1 < chunks.size()) start(chunks[c + 1], buf.arriving[(c + 1) % 2].data());

    const Clock::time_point compute_start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    const KvViews kv = kv_views(call, rows_in_chunk, buf.hand.data());
    bool computed = false;
    for (const Piece& qp : q_pieces)
      for (std::int64_t b0 = 0; b0 < qp.rows; b0 += block) {
        const std::int64_t rows = std::min(block, qp.rows - b0);
        if (!band.visible(qp.global + b0, rows, chunk.begin, rows_in_chunk, S)) {
          ++stats.pieces_skipped;
          continue;
        }
        Problem p = piece_problem(call, band, row_slice(query, qp.local + b0, rows), qp.global + b0, kv, 0,
                                  rows_in_chunk, chunk.begin);
        if (carry) {
          p.carried = {buf.state.data() + (qp.local + b0) * (Ev + 2), Lr, true};
          run_problem(p, call.options.backend);
        } else {
          p.output = sdpa::detail::make_operand(
              packed_view(buf.part_out.data(), acc_dtype, call.batch_shape, call.heads_q, rows, Ev), call.batch_shape,
              call.heads_q);
          TensorView lse_view = packed_view(buf.part_lse.data(), acc_dtype, call.batch_shape, call.heads_q, rows, 1);
          lse_view.shape.pop_back();
          lse_view.strides.pop_back();
          p.lse = lse_operand(call, lse_view);
          run_problem(p, call.options.backend);
          for (std::int64_t m = 0; m < matrices; ++m)
            merge_rows(buf.acc_out.data() + (m * Lr + qp.local + b0) * Ev, buf.acc_lse.data() + m * Lr + qp.local + b0,
                       buf.part_out.data() + m * rows * Ev, buf.part_lse.data() + m * rows, rows, Ev);
        }
        computed = true;
        exchange.poll();
      }
    stats.compute_seconds += seconds_since(compute_start);
    stats.compute_cpu_seconds += thread_cpu_seconds() - cpu_start;
    stats.steps_computed += computed ? 1 : 0;
    const Clock::time_point wait_start = Clock::now();
    exchange.wait();
    stats.wait_seconds += seconds_since(wait_start);
  }
  stats.bytes_sent += exchange.bytes_sent();

  if (carry) {
    // The kernel's own ending (sinks, O = acc / l, lse = m + log l) on the carried rows:
    // one call over this rank's rows with no keys.
    std::byte no_keys[8] = {};
    Problem finish = piece_problem(call, band, query, 0, kv_views(call, 0, no_keys), 0, 0, 0);
    finish.sinks = call.sinks;
    finish.output = sdpa::detail::make_operand(outputs.output, call.batch_shape, call.heads_q);
    if (outputs.lse) finish.lse = lse_operand(call, *outputs.lse);
    finish.carried = {buf.state.data(), Lr, false};
    run_problem(finish, call.options.backend);
    return;
  }
  // The sinks, once per row, after the last merge (merge.h).
  if (!call.sinks.empty())
    for (std::int64_t m = 0; m < matrices; ++m)
      fold_sink(buf.acc_out.data() + m * Lr * Ev, buf.acc_lse.data() + m * Lr,
                static_cast<Acc>(call.sinks[static_cast<std::size_t>(m)]), Lr, Ev);
  const sdpa::detail::Operand out = sdpa::detail::make_operand(outputs.output, call.batch_shape, call.heads_q);
  for (std::int64_t m = 0; m < matrices; ++m)
    for (std::int64_t i = 0; i < Lr; ++i)
      for (std::int64_t d = 0; d < Ev; ++d)
        out.store<Acc>(m, i, d, buf.acc_out[static_cast<std::size_t>((m * Lr + i) * Ev + d)]);
  if (outputs.lse) {
    const sdpa::detail::Operand lse = lse_operand(call, *outputs.lse);
    for (std::int64_t m = 0; m < matrices; ++m)
      for (std::int64_t i = 0; i < Lr; ++i)
        lse.store<Acc>(m, i, 0, buf.acc_lse[static_cast<std::size_t>(m * Lr + i)]);
  }
}

template struct OrderedBuffers<float>;
template struct OrderedBuffers<double>;
template void ordered_forward<float>(MPI_Comm, const ShardCall&, const TensorView&, const TensorView&,
                                     const TensorView&, const ForwardOutputs&, OrderedBuffers<float>&);
template void ordered_forward<double>(MPI_Comm, const ShardCall&, const TensorView&, const TensorView&,
                                      const TensorView&, const ForwardOutputs&, OrderedBuffers<double>&);

}  // namespace sdpa::distributed::detail
