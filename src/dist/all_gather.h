// The all-gather variant's exchange (Exchange::all_gather): every rank's packed K/V shard
// (shards.h's layout) gathered once onto every rank, with MPI_Allgatherv.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "dist/shards.h"

namespace sdpa::distributed::detail {

struct GatheredKv {
  std::vector<std::byte> bytes;            // every shard, rank after rank
  std::vector<std::size_t> offset;         // where rank k's shard starts
  std::vector<int> counts, displacements;  // MPI_Allgatherv's, in bytes
  double bytes_sent = 0;                   // this rank's shard, once to each other rank
};

// The gather's sizes and its buffer, before the ranks agree (so that a size MPI cannot
// count, or memory running out, is an agreed error, not a rank missing from a
// collective): throws sdpa::Error naming sharding.exchange past 2 GiB.
GatheredKv plan_gather(const ShardCall& call);

// Collective. `own` is this rank's packed shard (pack_kv); fills gathered.bytes.
void gather_kv(MPI_Comm comm, const ShardCall& call, const std::byte* own, GatheredKv& gathered);

// Sums every rank's contributions to every shard's gradients (`all`, rank after rank,
// `floats[k]` elements of shard k) and leaves this rank's shard's sum in `mine`
// (MPI_Reduce_scatter).
template <class Acc>
void reduce_scatter_gradients(MPI_Comm comm, const std::vector<Acc>& all, const std::vector<int>& floats, Acc* mine);

}  // namespace sdpa::distributed::detail
