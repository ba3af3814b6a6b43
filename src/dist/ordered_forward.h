// The ordered exchange's forward (Exchange::ordered; ordered_forward.cpp).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "dist/chunks.h"
#include "dist/shards.h"

namespace sdpa::distributed::detail {

// Everything the ordered forward allocates by the call's sizes, allocated before the
// ranks agree (agreement.h), as the ring's buffers are: memory running out is then an
// error on every rank. Acc: the accumulation type.
template <class Acc>
struct OrderedBuffers {
  std::vector<Chunk> chunks;                 // the keys in global order (chunks.h)
  std::vector<Acc> state;                    // carried: (m, l, acc[Ev]) per row (Problem::carried)
  std::vector<Acc> acc_out, acc_lse;         // merged: the output rows and lse so far
  std::vector<Acc> part_out, part_lse;       // merged: one query block's partial result
  std::vector<std::byte> own;                // this rank's shard, packed
  std::vector<std::byte> arriving[2], hand;  // two chunks in flight (by segment), the one computed
  explicit OrderedBuffers(const ShardCall& call);
};

// Collective; `call` checked and agreed on by every rank.
template <class Acc>
void ordered_forward(MPI_Comm comm, const ShardCall& call, const TensorView& query, const TensorView& key,
                     const TensorView& value, const ForwardOutputs& outputs, OrderedBuffers<Acc>& buffers);

}  // namespace sdpa::distributed::detail
