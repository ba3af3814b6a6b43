// The ordered exchange's forward: the key chunks (chunks.h) in global order, each
// broadcast by its owner(s) while the chunk before it is computed (double buffering,
// polled between query blocks as the ring is). For float64 on the CPU backend every
// query row's online-softmax state (max, sum, un-normalised output) is carried from one
// chunk to the next through the portable kernel's resumable call (Problem::carried) and
// finished once at the end: the arithmetic of one single-process call, tile for tile, so
// the output and lse are bitwise sdpa::forward's (the sinks folded by the kernel's own
// ending). Otherwise (float32, bfloat16, float16 on the SIMD kernels; the reference
// backend) each chunk's partial output merges by its log-sum-exp, as the ring's do, and
// the sinks fold once after the last chunk (merged_rows.h).
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
#include "dist/merged_rows.h"
#include "dist/stats.h"

namespace sdpa::distributed::detail {

namespace {

// Whether the CPU backend's kernel for this dtype resumes from Problem::carried.
template <class Acc>
bool carries(const ShardCall& call) {
  return call.options.backend != Backend::reference &&
         sdpa::detail::cpu_forward_resumable(std::is_same_v<Acc, double>);
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
    merged.emplace(call);
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
  const int N = call.ranks, r = call.rank;
  const std::int64_t Lr = call.L_shard, Ev = call.Ev;
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
          run_piece(p, call.options.backend);
        } else {
          buf.merged->compute_and_merge(call, p, qp.local + b0, rows);
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
    if (outputs.lse) finish.lse = sdpa::detail::lse_operand(*outputs.lse, call.batch_shape, call.heads_q);
    finish.carried = {buf.state.data(), Lr, false};
    run_piece(finish, call.options.backend);
    return;
  }
  buf.merged->finish(call, outputs);  // the sinks folded once, then the rows stored
}

template struct OrderedBuffers<float>;
template struct OrderedBuffers<double>;
template void ordered_forward<float>(MPI_Comm, const ShardCall&, const TensorView&, const TensorView&,
                                     const TensorView&, const ForwardOutputs&, OrderedBuffers<float>&);
template void ordered_forward<double>(MPI_Comm, const ShardCall&, const TensorView&, const TensorView&,
                                      const TensorView&, const ForwardOutputs&, OrderedBuffers<double>&);

}  // namespace sdpa::distributed::detail
