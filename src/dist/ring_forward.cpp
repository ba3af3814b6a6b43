// The ring forward (and the entry point of every exchange's; the ordered one is
// ordered_forward.cpp): N steps; at step s this rank holds the K/V shard of rank r − s,
// computes its queries against it while that shard moves on to rank r + 1 and the next
// one arrives from r − 1, and merges each partial output into its accumulator by the
// log-sum-exp (merged_rows.h). Query pieces go in blocks, with an MPI poll between blocks, so
// that the transfer advances during the compute (exchange.h). The sinks join each row
// once, after the last merge (MergedRows::finish): the steps' partial softmaxes carry
// none, or every step would count them again.
//
// Work skipped: a (query block, key piece) pair whose keys the band masks for every
// query of the block (causal, window) is never computed. With the zigzag partition a
// causal call then does the same work on every rank.
#include <time.h>

#include <chrono>
#include <optional>
#include <vector>

#include "api/views.h"
#include "dist/agreement.h"
#include "dist/all_gather.h"
#include "dist/exchange.h"
#include "dist/merged_rows.h"
#include "dist/ordered_forward.h"
#include "dist/shards.h"
#include "dist/stats.h"
#include "sdpa/distributed.h"

namespace sdpa::distributed {

namespace detail {

RingStats& last_ring_stats() {
  static RingStats stats;
  return stats;
}

namespace {

constexpr int kForwardTag = 7001;

// Everything the forward allocates by the call's sizes, allocated before the ranks agree
// (agreement.h): memory running out is then an error on every rank, not a rank missing
// from the ring.
template <class Acc>
struct ForwardBuffers {
  MergedRows<Acc> rows;               // this rank's query rows, merged over the steps
  std::vector<std::byte> buffers[2];  // the K/V shard in hand and the one arriving
  GatheredKv gathered;                // all-gather: every shard

  explicit ForwardBuffers(const ShardCall& call) : rows(call) {
    const int N = call.ranks;
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
  const int N = call.ranks, r = call.rank;
  const std::vector<Piece> q_pieces = shard_pieces(call.sharding.query_length, N, r, call.sharding.partition);
  const GlobalBand band = global_band(call);
  std::vector<std::byte>* buffers = buf.buffers;
  const std::int64_t block = block_rows(call.L_shard);
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
          buf.rows.compute_and_merge(call, p, qp.local + b0, rows);
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
  buf.rows.finish(call, outputs);
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
