// The ordered exchange's forward (Exchange::ordered; ordered_forward.cpp).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "dist/chunks.h"
#include "dist/merged_rows.h"
#include "dist/shards.h"

namespace sdpa::distributed::detail {

// Everything the ordered forward allocates by the call's sizes, allocated before the
// ranks agree (agreement.h), as the ring's buffers are: memory running out is then an
// error on every rank. Acc: the accumulation type.
template <class Acc>
struct OrderedBuffers {
  std::vector<Chunk> chunks;                 // the keys in global order (chunks.h)
  std::vector<Acc> state;                    // carried: (m, l, acc[Ev]) per row (Problem::carried)
  std::optional<MergedRows<Acc>> merged;     // not carried: the rows merged chunk by chunk
  std::vector<std::byte> own;                // this rank's shard, packed
  std::vector<std::byte> arriving[2], hand;  // two chunks in flight (by segment), the one computed
  explicit OrderedBuffers(const ShardCall& call);
};

// Collective; `call` checked and agreed on by every rank.
template <class Acc>
void ordered_forward(MPI_Comm comm, const ShardCall& call, const TensorView& query, const TensorView& key,
                     const TensorView& value, const ForwardOutputs& outputs, OrderedBuffers<Acc>& buffers);

}  // namespace sdpa::distributed::detail
