#include "dist/all_gather.h"

#include <climits>
#include <type_traits>

#include "api/views.h"

namespace sdpa::distributed::detail {

GatheredKv plan_gather(const ShardCall& call) {
  GatheredKv gathered;
  std::size_t total = 0;
  for (int k = 0; k < call.ranks; ++k) {
    const std::size_t bytes =
        kv_layout(call, shard_length(call.sharding.key_length, call.ranks, k, call.sharding.partition), false).total();
    // MPI counts are int: past 2 GiB the ring, which sends one shard at a time, is the way.
    if (total + bytes > static_cast<std::size_t>(INT_MAX))
      sdpa::detail::fail("sharding.exchange",
                         "expected all K/V shards within 2 GiB for all_gather, got more; use ring");
    gathered.offset.push_back(total);
    gathered.counts.push_back(static_cast<int>(bytes));
    gathered.displacements.push_back(static_cast<int>(total));
    total += bytes;
  }
  gathered.bytes.resize(total);
  return gathered;
}

void gather_kv(MPI_Comm comm, const ShardCall& call, const std::byte* own, GatheredKv& gathered) {
  const int mine = gathered.counts[static_cast<std::size_t>(call.rank)];
  MPI_Allgatherv(own, mine, MPI_BYTE, gathered.bytes.data(), gathered.counts.data(), gathered.displacements.data(),
                 MPI_BYTE, comm);
  gathered.bytes_sent = static_cast<double>(mine) * (call.ranks - 1);
}

template <class Acc>
void reduce_scatter_gradients(MPI_Comm comm, const std::vector<Acc>& all, const std::vector<int>& floats, Acc* mine) {
  const MPI_Datatype type = std::is_same_v<Acc, double> ? MPI_DOUBLE : MPI_FLOAT;
  MPI_Reduce_scatter(all.data(), mine, floats.data(), type, MPI_SUM, comm);
}

template void reduce_scatter_gradients<float>(MPI_Comm, const std::vector<float>&, const std::vector<int>&, float*);
template void reduce_scatter_gradients<double>(MPI_Comm, const std::vector<double>&, const std::vector<int>&, double*);

}  // namespace sdpa::distributed::detail
