// The all-gather variant's exchange (Exchange::all_gather): every rank's packed K/V shard
// (shards.h's layout) gathered once onto every rank, with MPI_Allgatherv.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "dist/shards.h"

namespace sdpa::distributed::detail {

struct GatheredKv {
  std::vector<std::byte> bytes;       // every shard, rank after rank
  std::vector<std::size_t> offset;    // where rank k's shard starts
  double bytes_sent = 0;              // this rank's shard, once to each other rank
};

// Collective. `own` is this rank's packed shard (pack_kv).
GatheredKv gather_kv(MPI_Comm comm, const ShardCall& call, const std::byte* own);

// Sums every rank's contributions to every shard's gradients (`all`, rank after rank,
// `floats[k]` elements of shard k) and leaves this rank's shard's sum in `mine`
// (MPI_Reduce_scatter).
template <class Acc>
void reduce_scatter_gradients(MPI_Comm comm, const std::vector<Acc>& all, const std::vector<int>& floats, Acc* mine);

}  // namespace sdpa::distributed::detail
