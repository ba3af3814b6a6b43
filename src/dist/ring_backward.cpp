// The ring backward. Each rank keeps its queries, dO, O and lse (the merged forward's:
// exp(s − lse) is then the whole problem's P, so each step's piece needs nothing from
// the others) and accumulates dQ locally; K/V shards travel as in the forward,
// double-buffered and overlapped; each K/V shard's dK/dV accumulator (float32, float64
// for float64) follows it one step behind: at step s this rank adds its contribution to
// the accumulator that rank r − 1 sent for the same shard and passes it on to r + 1,
// so after N steps it arrives, summed over every rank's queries, at its owner.
#include <time.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <vector>

#include "api/operands.h"
#include "api/sink_gradients.h"
#include "api/views.h"
#include "cpu/dispatch.h"
#include "dist/agreement.h"
#include "dist/all_gather.h"
#include "dist/exchange.h"
#include "dist/shards.h"
#include "dist/stats.h"
#include "sdpa/distributed.h"

namespace sdpa::distributed {

namespace detail {

namespace {

constexpr int kKeyValueTag = 7002, kGradientTag = 7003;
std::int64_t block_rows(std::int64_t rows) { return std::max<std::int64_t>(64, (rows + 7) / 8); }
// dK then dV of a shard of `rows` keys: the accumulator that travels.
std::size_t gradient_floats(const ShardCall& call, std::int64_t rows) {
  return static_cast<std::size_t>(call.batch * call.heads_kv * rows * (call.E + call.Ev));
}

template <class Acc>
void add_into(Acc* into, const Acc* from, std::size_t count) {
  for (std::size_t k = 0; k < count; ++k) into[k] += from[k];
}

// The sinks' gradient Σ_i P_i (dlse_i − dO_i·O_i), P_i = exp(sink − lse_i) (api/sink_gradients.h):
// the lse the forward returned contains the sink, so this rank's rows give their share
// with nothing from the others; one MPI_Allreduce sums the shares of every rank. Every
// rank joins it when the call has sinks (they are in the agreed signature), whether or
// not it asked for the gradient: whether it did is its own choice, not agreed, and a sum
// entered by some ranks only would wait for ever.
void sum_sink_gradients_over_ranks(MPI_Comm comm, const ShardCall& call, const BackwardInputs& in,
                                   const std::optional<TensorView>& grad_sinks) {
  std::vector<double> per_matrix(call.sinks.size(), 0.0);
  if (call.L_shard > 0) {  // a rank with no rows adds nothing, but joins the sum
    const sdpa::detail::Shape& bs = call.batch_shape;
    sdpa::detail::BackwardProblem rows;
    rows.batch = call.batch;
    rows.heads_q = call.heads_q;
    rows.L = call.L_shard;
    rows.Ev = call.Ev;
    rows.sinks = call.sinks;
    rows.output = sdpa::detail::make_operand(in.output, bs, call.heads_q);
    rows.grad_output = sdpa::detail::make_operand(in.grad_output, bs, call.heads_q);
    rows.lse = sdpa::detail::lse_operand(in.lse, bs, call.heads_q);
    if (in.grad_lse) rows.grad_lse = sdpa::detail::lse_operand(*in.grad_lse, bs, call.heads_q);
    sdpa::detail::add_sink_gradients(rows, per_matrix.data());
  }
  MPI_Allreduce(MPI_IN_PLACE, per_matrix.data(), static_cast<int>(per_matrix.size()), MPI_DOUBLE, MPI_SUM, comm);
  if (grad_sinks) sdpa::detail::store_sink_gradients(per_matrix, *grad_sinks);
}

// Everything the backward allocates by the call's sizes, allocated before the ranks agree
// (as the forward's ForwardBuffers): memory running out is an error on every rank.
template <class Acc>
struct BackwardBuffers {
  std::vector<Acc> dq, dq_part, dk_part, dv_part;  // dQ of this rank's rows; one piece's dQ, dK, dV
  std::vector<Acc> step_grads[2], incoming;        // the travelling dK/dV accumulators (sent, received)
  std::vector<std::byte> buffers[2];               // the K/V shard in hand and the one arriving
  GatheredKv gathered;                             // all-gather: every K/V shard
  std::vector<Acc> all_grads;                      // all-gather: this rank's share of every shard's dK/dV
  std::vector<std::size_t> grad_offset;            // where shard k's starts in all_grads
  std::vector<int> grad_floats;                    // and its length (MPI_Reduce_scatter's counts)

  explicit BackwardBuffers(const ShardCall& call) {
    const int N = call.ranks;
    const Sharding& sh = call.sharding;
    const std::int64_t q_matrices = call.batch * call.heads_q, kv_matrices = call.batch * call.heads_kv;
    const std::int64_t Lr = call.L_shard, E = call.E, Ev = call.Ev;
    dq.assign(static_cast<std::size_t>(q_matrices * Lr * E), Acc{0});
    const std::int64_t block = std::min(block_rows(Lr), std::max<std::int64_t>(Lr, 1));
    std::int64_t largest = 0;
    for (int k = 0; k < N; ++k) largest = std::max(largest, shard_length(sh.key_length, N, k, sh.partition));
    dq_part.resize(static_cast<std::size_t>(q_matrices * block * E));
    dk_part.resize(static_cast<std::size_t>(kv_matrices * largest * E));
    dv_part.resize(static_cast<std::size_t>(kv_matrices * largest * Ev));
    incoming.resize(gradient_floats(call, largest));
    for (auto& g : step_grads) g.resize(incoming.size());
    buffers[0].resize(kv_layout(call, largest, false).total());
    if (sh.exchange == Exchange::ring) buffers[1].resize(buffers[0].size());
    if (sh.exchange == Exchange::all_gather) {
      gathered = plan_gather(call);
      std::size_t total = 0;
      for (int k = 0; k < N; ++k) {
        const std::size_t floats = gradient_floats(call, shard_length(sh.key_length, N, k, sh.partition));
        // MPI_Reduce_scatter counts elements in an int.
        if (floats > static_cast<std::size_t>(INT_MAX))
          sdpa::detail::fail("sharding.exchange",
                             "expected every shard's dK/dV within 2^31 elements for all_gather, got more; use ring");
        grad_offset.push_back(total);
        grad_floats.push_back(static_cast<int>(floats));
        total += floats;
      }
      all_grads.assign(total, Acc{0});
    }
  }
};

template <class Acc>
void ring_backward(MPI_Comm comm, const ShardCall& call, const BackwardInputs& in, const BackwardOutputs& outputs,
                   BackwardBuffers<Acc>& buf) {
  RingStats& stats = last_ring_stats();
  const DType acc_dtype = std::is_same_v<Acc, double> ? DType::float64 : DType::float32;
  const int N = call.ranks, r = call.rank;
  const Sharding& sh = call.sharding;
  const std::int64_t q_matrices = call.batch * call.heads_q, kv_matrices = call.batch * call.heads_kv;
  const std::int64_t Lr = call.L_shard, E = call.E, Ev = call.Ev;
  const std::vector<Piece> q_pieces = shard_pieces(sh.query_length, N, r, sh.partition);
  const GlobalBand band = global_band(call);
  auto keys_of = [&](int rank) { return shard_length(sh.key_length, N, rank, sh.partition); };
  auto gradient_floats = [&](std::int64_t rows) { return detail::gradient_floats(call, rows); };

  std::vector<Acc>&dq = buf.dq, &dq_part = buf.dq_part, &dk_part = buf.dk_part, &dv_part = buf.dv_part;
  std::vector<Acc>*step_grads = buf.step_grads, &incoming = buf.incoming;
  std::vector<std::byte>* buffers = buf.buffers;
  const std::int64_t block = std::min(block_rows(Lr), std::max<std::int64_t>(Lr, 1));
  pack_kv(call, in.key, in.value, buffers[0].data());

  // All-gather: every K/V shard at once; each rank's contributions to every shard's dK/dV
  // in one buffer (shard after shard), summed onto the owners by one reduce-scatter.
  const bool gather = sh.exchange == Exchange::all_gather;
  GatheredKv& gathered = buf.gathered;
  std::vector<Acc>& all_grads = buf.all_grads;
  const std::vector<std::size_t>& grad_offset = buf.grad_offset;
  const std::vector<int>& grad_floats = buf.grad_floats;
  if (gather) {
    gather_kv(comm, call, buffers[0].data(), gathered);
    stats.bytes_sent += gathered.bytes_sent;
  }

  Transfer kv_exchange(comm, kKeyValueTag), grad_receive(comm, kGradientTag),
      grad_send[2]{Transfer(comm, kGradientTag), Transfer(comm, kGradientTag)};
  for (int s = 0; s < N; ++s) {
    const int source = (r - s + N) % N;
    const std::int64_t S_source = keys_of(source);
    std::byte* hand =
        gather ? gathered.bytes.data() + gathered.offset[static_cast<std::size_t>(source)] : buffers[s % 2].data();
    if (!gather && s + 1 < N) {
      const int next_source = (r - s - 1 + N) % N;
      kv_exchange.start(hand, kv_layout(call, S_source, false).total(), (r + 1) % N, buffers[(s + 1) % 2].data(),
                        kv_layout(call, keys_of(next_source), false).total(), (r - 1 + N) % N);
    }
    // The accumulator of this shard so far (none at step 0: it is this rank's own).
    if (!gather && s > 0)
      grad_receive.start(nullptr, 0, 0, incoming.data(), gradient_floats(S_source) * sizeof(Acc), (r - 1 + N) % N);
    // The buffer this step's sum goes out in was sent two steps ago: that send must be done.
    std::vector<Acc>& grads = step_grads[s % 2];
    grad_send[s % 2].wait();
    Acc* dk_acc = gather ? all_grads.data() + grad_offset[static_cast<std::size_t>(source)] : grads.data();
    if (!gather)
      std::fill(grads.begin(), grads.begin() + static_cast<std::ptrdiff_t>(gradient_floats(S_source)), Acc{0});
    Acc* dv_acc = dk_acc + kv_matrices * S_source * E;

    const Clock::time_point compute_start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    const KvViews kv = kv_views(call, S_source, hand);
    for (const Piece& kp : shard_pieces(sh.key_length, N, source, sh.partition)) {
      for (const Piece& qp : q_pieces)
        for (std::int64_t b0 = 0; b0 < qp.rows; b0 += block) {
          const std::int64_t rows = std::min(block, qp.rows - b0);
          if (kp.rows == 0 || !band.visible(qp.global + b0, rows, kp.global, kp.rows, sh.key_length)) continue;
          const std::int64_t row0 = qp.local + b0;
          sdpa::detail::BackwardProblem p;
          static_cast<Problem&>(p) = piece_problem(call, band, row_slice(in.query, row0, rows), qp.global + b0, kv,
                                                   kp.local, kp.rows, kp.global);
          const sdpa::detail::Shape& bs = call.batch_shape;
          p.output = sdpa::detail::make_operand(row_slice(in.output, row0, rows), bs, call.heads_q);
          p.grad_output = sdpa::detail::make_operand(row_slice(in.grad_output, row0, rows), bs, call.heads_q);
          // lse (…, L) as rows: a (…, L, 1) view of the same memory, sliced.
          auto lse_rows = [&](const TensorView& lse) {
            TensorView as_rows = lse;
            as_rows.strides = lse.effective_strides();
            as_rows.shape.push_back(1);
            as_rows.strides.push_back(1);
            TensorView slice = row_slice(as_rows, row0, rows);
            slice.shape.pop_back();
            slice.strides.pop_back();
            return sdpa::detail::lse_operand(slice, bs, call.heads_q);
          };
          p.lse = lse_rows(in.lse);
          if (in.grad_lse) p.grad_lse = lse_rows(*in.grad_lse);
          p.grad_query = sdpa::detail::make_operand(packed_view(dq_part.data(), acc_dtype, bs, call.heads_q, rows, E),
                                                    bs, call.heads_q);
          p.grad_key = sdpa::detail::make_operand(packed_view(dk_part.data(), acc_dtype, bs, call.heads_kv, kp.rows, E),
                                                  bs, call.heads_kv);
          p.grad_value = sdpa::detail::make_operand(
              packed_view(dv_part.data(), acc_dtype, bs, call.heads_kv, kp.rows, Ev), bs, call.heads_kv);
          if (p.batch * p.heads_q > 0) sdpa::detail::cpu_backward(p);
          for (std::int64_t m = 0; m < q_matrices; ++m)
            add_into(dq.data() + (m * Lr + row0) * E, dq_part.data() + m * rows * E,
                     static_cast<std::size_t>(rows * E));
          for (std::int64_t m = 0; m < kv_matrices; ++m) {
            add_into(dk_acc + (m * S_source + kp.local) * E, dk_part.data() + m * kp.rows * E,
                     static_cast<std::size_t>(kp.rows * E));
            add_into(dv_acc + (m * S_source + kp.local) * Ev, dv_part.data() + m * kp.rows * Ev,
                     static_cast<std::size_t>(kp.rows * Ev));
          }
          kv_exchange.poll();
          grad_receive.poll();
        }
    }
    stats.compute_seconds += seconds_since(compute_start);
    stats.compute_cpu_seconds += thread_cpu_seconds() - cpu_start;
    if (gather) continue;
    const Clock::time_point wait_start = Clock::now();
    grad_receive.wait();
    stats.wait_seconds += seconds_since(wait_start);
    if (s > 0) add_into(grads.data(), incoming.data(), gradient_floats(S_source));
    // On to the next rank; after the last step that is the shard's owner.
    grad_send[s % 2].start(grads.data(), gradient_floats(S_source) * sizeof(Acc), (r + 1) % N, nullptr, 0, 0);
    const Clock::time_point kv_wait = Clock::now();
    kv_exchange.wait();
    stats.wait_seconds += seconds_since(kv_wait);
  }
  // This rank's own shard's dK, dV, summed over every rank: from rank r − 1 (ring), or
  // from the reduce-scatter (all-gather).
  const Clock::time_point wait_start = Clock::now();
  if (gather) {
    reduce_scatter_gradients(comm, all_grads, grad_floats, incoming.data());
    stats.bytes_sent += static_cast<double>((all_grads.size() - gradient_floats(call.S_shard)) * sizeof(Acc));
  } else {
    grad_receive.start(nullptr, 0, 0, incoming.data(), gradient_floats(call.S_shard) * sizeof(Acc), (r - 1 + N) % N);
    grad_receive.wait();
    for (auto& e : grad_send) e.wait();
  }
  stats.wait_seconds += seconds_since(wait_start);
  stats.bytes_sent += kv_exchange.bytes_sent() + grad_send[0].bytes_sent() + grad_send[1].bytes_sent();

  const sdpa::detail::Shape& bs = call.batch_shape;
  const sdpa::detail::Operand gq = sdpa::detail::make_operand(outputs.grad_query, bs, call.heads_q);
  for (std::int64_t m = 0; m < q_matrices; ++m)
    for (std::int64_t i = 0; i < Lr; ++i)
      for (std::int64_t e = 0; e < E; ++e) gq.store<Acc>(m, i, e, dq[static_cast<std::size_t>((m * Lr + i) * E + e)]);
  const std::int64_t Sr = call.S_shard;
  const sdpa::detail::Operand gk = sdpa::detail::make_operand(outputs.grad_key, bs, call.heads_kv);
  const sdpa::detail::Operand gv = sdpa::detail::make_operand(outputs.grad_value, bs, call.heads_kv);
  const Acc* dk = incoming.data();
  const Acc* dv = incoming.data() + kv_matrices * Sr * E;
  for (std::int64_t m = 0; m < kv_matrices; ++m)
    for (std::int64_t j = 0; j < Sr; ++j) {
      for (std::int64_t e = 0; e < E; ++e) gk.store<Acc>(m, j, e, dk[(m * Sr + j) * E + e]);
      for (std::int64_t d = 0; d < Ev; ++d) gv.store<Acc>(m, j, d, dv[(m * Sr + j) * Ev + d]);
    }
  if (!call.sinks.empty()) sum_sink_gradients_over_ranks(comm, call, in, outputs.grad_sinks);
}

}  // namespace

}  // namespace detail

void backward(MPI_Comm comm, const BackwardInputs& inputs, const BackwardOutputs& outputs, const Sharding& sharding,
              const Options& options) {
  using namespace detail;
  const auto start = std::chrono::steady_clock::now();
  last_ring_stats() = {};
  ShardCall call;
  std::optional<BackwardBuffers<float>> buffers32;
  std::optional<BackwardBuffers<double>> buffers64;
  agree(
      comm,
      [&] {
        call = check_shards(comm, inputs.query, inputs.key, inputs.value, sharding, options);
        // The ordered exchange's backward is the ring's: it needs only the forward's lse,
        // and gradients carry no bitwise claim (set before the buffers are sized).
        if (call.sharding.exchange == Exchange::ordered) call.sharding.exchange = Exchange::ring;
        // The oracle's backward recomputes each row's softmax from the keys it is given,
        // not from the lse: a piece of the keys would get its own softmax, not the whole's.
        if (options.backend == Backend::reference)
          sdpa::detail::fail("options.backend",
                             "expected automatic or cpu in a ring backward (the float64 oracle "
                             "recomputes the softmax from a piece's keys alone), got reference");
        if (outputs.grad_mask)
          sdpa::detail::fail("grad_mask",
                             "expected none in a ring call (a key-padding mask has no gradient), got a buffer");
        std::vector<sdpa::detail::Span> spans = call.input_spans;
        sdpa::detail::check_backward_reads(inputs, call.output_shape, call.lse_shape, call.dtype, call.lse_dtype,
                                           spans);
        std::vector<sdpa::detail::ExpectedView> outs{
            {&outputs.grad_query, "grad_query", &inputs.query.shape, call.dtype},
            {&outputs.grad_key, "grad_key", &inputs.key.shape, call.dtype},
            {&outputs.grad_value, "grad_value", &inputs.value.shape, call.dtype}};
        sdpa::detail::expect_grad_sinks(outputs, options, outs);
        sdpa::detail::check_outputs(outs, spans);
        if (call.dtype == DType::float64)
          buffers64.emplace(call);
        else
          buffers32.emplace(call);
        return call.signature;
      },
      "sharding");
  after_agreement(comm, "sdpa::distributed::backward", [&] {
    if (buffers64)
      ring_backward<double>(comm, call, inputs, outputs, *buffers64);
    else
      ring_backward<float>(comm, call, inputs, outputs, *buffers32);
  });
  last_ring_stats().total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace sdpa::distributed
