// Exact attention over a sequence split across MPI processes (ring attention, Liu et al.
// 2023): each rank holds its shard of Q, K and V along the sequence, K/V shards travel
// around the ring, and each rank merges its partial outputs exactly by their
// log-sum-exp. Built where MPI is found (library sdpa_dist). docs/distributed.md says
// how to run it and what it costs.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::distributed {

// How a global sequence of length n is cut among N ranks.
//   contiguous: rank r holds rows [r·n/N, (r+1)·n/N)                (integer division)
//   zigzag:     the sequence is cut into 2N chunks, chunk c = [c·n/(2N), (c+1)·n/(2N));
//               rank r holds chunks r and 2N−1−r, in that order — under a causal mask
//               every rank then does the same work (ring-flash-attention, Megatron's
//               context parallelism).
// Lengths need not divide: shards differ by at most a row (two for zigzag).
enum class Partition { contiguous, zigzag };

// How K/V reach every rank.
//   ring:       N − 1 steps, each passing one K/V shard to the next rank while the shard
//               in hand is computed: memory O(shard), the transfer hidden behind the
//               compute when shards are long enough (docs/distributed.md).
//   all_gather: one MPI_Allgatherv of every K/V shard first (Llama 3's context
//               parallelism), then the compute: no per-step latency, but memory for the
//               whole K/V on every rank. Wins for GQA/MQA, where K/V are Hq/Hkv times
//               smaller than Q, and for short shards, whose compute cannot hide a step.
//   ordered:    the keys in global order: each chunk of K/V broadcast by its owner
//               (MPI_Ibcast, the next chunk's transfer overlapping the compute of the one
//               in hand; memory O(shard)), and every rank carries its query rows'
//               online-softmax state (max, sum, un-normalised output) from chunk to chunk
//               instead of merging normalised partial results. For finite float64 inputs
//               on the CPU backend the output and lse are bitwise sdpa::forward's
//               (its key tiles of 64 are kept: chunks are the partition's pieces with
//               their boundaries moved down to multiples of 64 keys, a chunk astride two
//               owners filled by both). Other dtypes and the reference backend merge each
//               chunk's partial output by its lse, as the ring does. The backward is the
//               ring's.
//               The same bytes in all as the ring. Pick it for reproducibility; the ring
//               lets each rank go at its own pace, where here every rank walks the chunks
//               in one order and waits for each chunk's owners (docs/distributed.md).
enum class Exchange { ring, all_gather, ordered };

// The global problem every rank's shard belongs to; the same on every rank.
struct Sharding {
  std::int64_t query_length = 0;  // global L
  std::int64_t key_length = 0;    // global S
  Partition partition = Partition::contiguous;
  Exchange exchange = Exchange::ring;
};

// Rows [begin, end) of the global sequence.
struct RowRange {
  std::int64_t begin = 0, end = 0;
};

// The global rows rank `rank` of `ranks` holds, in the order its shard stores them.
std::vector<RowRange> shard_rows(std::int64_t length, int ranks, int rank, Partition partition);
// Their count: the shard's length along the sequence.
std::int64_t shard_length(std::int64_t length, int ranks, int rank, Partition partition);

// The forward of the whole problem, computed from this rank's shards. Collective over
// `comm`: every rank calls it with the same Sharding and options and its own shards,
//   query (..., Hq, Lr, E), key (..., Hkv, Sr, E), value (..., Hkv, Sr, Ev)
// where Lr, Sr are shard_length(L or S, size, rank, partition), and receives its rows of
// the output (..., Hq, Lr, Ev) and, when asked, of the lse (..., Hq, Lr). The result is
// the single-process sdpa::forward's on the whole sequence: masks, windows and ALiBi see
// global indices, and dropout draws bitwise the single-process mask. Options as
// sdpa::forward's, except: no weights, and the mask (when given) is a bool key-padding
// mask, this rank's keys' flags, shape (..., 1, 1, Sr) or (Sr,) (true = the key takes
// part); it travels with its K/V shard. Sinks ((Hq,) or (batch..., Hq), the same on
// every rank) join each row once, after the ring's last merge; the lse contains them, as
// sdpa::forward's does.
//
// Every rank validates its arguments and allocates what the ring needs, then all agree
// (one collective) before any ring traffic: a bad shard, or memory running out, on one
// rank raises sdpa::Error on every rank — never a hang. What fails after that point ends
// the job with MPI_Abort (docs/distributed.md, "Errors: never a hang").
void forward(MPI_Comm comm, const TensorView& query, const TensorView& key, const TensorView& value,
             const ForwardOutputs& outputs, const Sharding& sharding, const Options& options = {});

// Gradients of the whole problem's loss for this rank's shards (collective, as forward):
// inputs.output and inputs.lse are this rank's rows of forward's results; each rank
// receives dQ, dK and dV of its own shards (dK, dV are summed over every rank's queries
// as they travel back around the ring, in float32 — float64 for float64) and, when
// outputs.grad_sinks is given (only with sinks), the whole gradient of the sinks, summed
// over every rank's rows. The ordered exchange's backward is the ring's (it needs only
// the forward's lse).
void backward(MPI_Comm comm, const BackwardInputs& inputs, const BackwardOutputs& outputs, const Sharding& sharding,
              const Options& options = {});

}  // namespace sdpa::distributed
