// Ring attention's costs for docs/distributed.md: under mpirun, each rank makes random
// shards of its own (never the global tensors: memory O(shard)) and times
// sdpa::distributed::forward; rank 0 prints one JSON line: the call's time (the slowest
// rank's median), per-rank compute (wall and CPU time), the balance max/min of the ranks'
// compute CPU time, the bytes each rank sent, the time ranks waited on the exchange, the
// same exchange timed alone (the link's bandwidth), and the fraction of the exchange
// hidden behind compute: 1 − wait / (steps · one step's transfer alone).
// `single` runs sdpa::forward on the whole sequence in one process instead.
//
//   mpirun -np 2 sdpa_ring_bench L E causal partition exchange repeats [window_left [dtype]]
//   sdpa_ring_bench L E causal single repeats [window_left [dtype]]
// exchange: ring, all_gather or ordered. window_left >= 0 adds a sliding window (for the
// memory runs: long L, little compute); −1 is none. dtype: float32 (default) or float64.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "dist/exchange.h"
#include "dist/stats.h"
#include "sdpa/distributed.h"
#include "sdpa/sdpa.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace dist = sdpa::distributed;

sdpa::Tensor random(std::vector<std::int64_t> shape, std::uint64_t seed, sdpa::DType dtype) {
  sdpa::Tensor t(dtype, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = normal(rng);
    if (dtype == sdpa::DType::float64)
      static_cast<double*>(t.data())[i] = x;
    else
      static_cast<float*>(t.data())[i] = static_cast<float>(x);
  }
  return t;
}

sdpa::DType dtype_arg(int argc, char** argv, int at) {
  return argc > at && std::string(argv[at]) == "float64" ? sdpa::DType::float64 : sdpa::DType::float32;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int single(std::int64_t L, std::int64_t E, bool causal, int repeats, std::int64_t window_left, sdpa::DType dtype) {
  const sdpa::Tensor q = random({1, 1, L, E}, 1, dtype), k = random({1, 1, L, E}, 2, dtype),
                     v = random({1, 1, L, E}, 3, dtype);
  sdpa::Options options;
  options.causal = causal ? sdpa::Causal::top_left : sdpa::Causal::none;
  options.window_left = window_left;
  std::vector<double> times;
  sdpa::forward(q.view(), k.view(), v.view(), options);  // warm-up
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    sdpa::forward(q.view(), k.view(), v.view(), options);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double flops = 4.0 * static_cast<double>(L) * static_cast<double>(L) * static_cast<double>(E) * (causal ? 0.5 : 1.0);
  std::printf("{\"mode\": \"single\", \"dtype\": \"%s\", \"L\": %lld, \"E\": %lld, \"causal\": %d, \"seconds\": %.4f, "
              "\"gflops\": %.1f}\n",
              sdpa::dtype_name(dtype), static_cast<long long>(L), static_cast<long long>(E), causal ? 1 : 0, median(times),
              flops / median(times) * 1e-9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: %s L E causal(0|1) zigzag|contiguous|single ring|all_gather|ordered|REPEATS [repeats] "
                 "[window_left [float32|float64]]\n",
                 argv[0]);
    return 2;
  }
  const std::int64_t L = std::atoll(argv[1]), E = std::atoll(argv[2]);
  const bool causal = std::atoi(argv[3]) != 0;
  const std::string partition_name = argv[4];
  if (partition_name == "single")
    return single(L, E, causal, std::atoi(argv[5]), argc > 6 ? std::atoll(argv[6]) : -1, dtype_arg(argc, argv, 7));
  const std::string exchange_name = argv[5];
  const bool all_gather = exchange_name == "all_gather";
  const dist::Exchange exchange = all_gather                  ? dist::Exchange::all_gather
                                  : exchange_name == "ordered" ? dist::Exchange::ordered
                                                               : dist::Exchange::ring;
  const sdpa::DType dtype = dtype_arg(argc, argv, 8);
  const std::size_t element = sdpa::dtype_size(dtype);
  const int repeats = argc > 6 ? std::atoi(argv[6]) : 3;

  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const dist::Partition partition = partition_name == "zigzag" ? dist::Partition::zigzag : dist::Partition::contiguous;
  const dist::Sharding sharding{L, L, partition, exchange};
  const std::int64_t rows = dist::shard_length(L, ranks, rank, partition);
  const std::uint64_t seed = 10 * static_cast<std::uint64_t>(rank);
  const sdpa::Tensor q = random({1, 1, rows, E}, seed + 1, dtype), k = random({1, 1, rows, E}, seed + 2, dtype),
                     v = random({1, 1, rows, E}, seed + 3, dtype);
  sdpa::Tensor out(dtype, {1, 1, rows, E});
  sdpa::Options options;
  options.causal = causal ? sdpa::Causal::top_left : sdpa::Causal::none;
  options.window_left = argc > 7 ? std::atoll(argv[7]) : -1;

  // The link alone: one ring step's K/V bytes, sent and received with no compute.
  // Its buffers are freed before the attention runs, so that the peak RSS is the call's.
  const std::size_t step_bytes = static_cast<std::size_t>(2 * rows * E) * element;
  std::vector<double> transfer;
  {
  std::vector<std::byte> send(step_bytes), receive(step_bytes + 64 * element * E);
  for (int r = 0; r < 5; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    sdpa::distributed::detail::Transfer t(MPI_COMM_WORLD, 99);
    const auto t0 = Clock::now();
    const int prev = (rank - 1 + ranks) % ranks;
    const std::size_t incoming = static_cast<std::size_t>(2 * dist::shard_length(L, ranks, prev, partition) * E) * element;
    t.start(send.data(), step_bytes, (rank + 1) % ranks, receive.data(), incoming, prev);
    t.wait();
    transfer.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  }
  const double step_transfer = median(transfer);

  std::vector<double> total, compute, cpu, wait, bytes;
  for (int r = 0; r <= repeats; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    dist::forward(MPI_COMM_WORLD, q.view(), k.view(), v.view(), {out.view(), std::nullopt, std::nullopt}, sharding,
                  options);
    const auto& s = dist::detail::last_ring_stats();
    if (r == 0) continue;  // warm-up
    total.push_back(s.total_seconds);
    compute.push_back(s.compute_seconds);
    cpu.push_back(s.compute_cpu_seconds);
    wait.push_back(s.wait_seconds);
    bytes.push_back(s.bytes_sent);
  }
  const double mine[6] = {median(total), median(compute), median(cpu), median(wait), bytes[0], step_transfer};
  std::vector<double> all(6 * static_cast<std::size_t>(ranks));
  MPI_Gather(mine, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double slowest = 0, cpu_max = 0, cpu_min = 1e300, wait_sum = 0, transfer_sum = 0, bytes_sum = 0;
    std::string per_rank;
    for (int k = 0; k < ranks; ++k) {
      const double* m = &all[6 * static_cast<std::size_t>(k)];
      slowest = std::max(slowest, m[0]);
      cpu_max = std::max(cpu_max, m[2]);
      cpu_min = std::min(cpu_min, m[2]);
      wait_sum += m[3];
      transfer_sum += m[5] * (all_gather ? 1 : ranks - 1);
      bytes_sum += m[4];
      char line[160];
      std::snprintf(line, sizeof line, "%s{\"compute_s\": %.3f, \"compute_cpu_s\": %.3f, \"wait_s\": %.4f, \"bytes\": %.0f}",
                    k ? ", " : "", m[1], m[2], m[3], m[4]);
      per_rank += line;
    }
    const double overlap = all_gather ? 0.0 : std::clamp(1.0 - wait_sum / transfer_sum, 0.0, 1.0);
    std::printf("{\"mode\": \"%s\", \"dtype\": \"%s\", \"ranks\": %d, \"L\": %lld, \"E\": %lld, \"causal\": %d, \"partition\": \"%s\", "
                "\"seconds\": %.4f, \"balance\": %.3f, \"bytes_total\": %.0f, \"step_transfer_s\": %.5f, "
                "\"link_GBps\": %.2f, \"overlap\": %.3f, \"per_rank\": [%s]}\n",
                exchange_name.c_str(), sdpa::dtype_name(dtype), ranks, static_cast<long long>(L), static_cast<long long>(E),
                causal ? 1 : 0, partition_name.c_str(), slowest, cpu_max / cpu_min, bytes_sum, all[5],
                static_cast<double>(step_bytes) / all[5] * 1e-9, overlap, per_rank.c_str());
  }
  MPI_Finalize();
  return 0;
}
