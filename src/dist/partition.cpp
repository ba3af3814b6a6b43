// The shard layouts of include/sdpa/distributed.h: which global rows a rank holds.
#include "sdpa/distributed.h"

namespace sdpa::distributed {

namespace {

// Rows [c·n/parts, (c+1)·n/parts): sizes differ by at most one, and every row belongs to
// exactly one part whatever n is (TransformerEngine #1930 dropped the remainder).
RowRange part(std::int64_t n, std::int64_t parts, std::int64_t c) { return {c * n / parts, (c + 1) * n / parts}; }

}  // namespace

std::vector<RowRange> shard_rows(std::int64_t length, int ranks, int rank, Partition partition) {
  if (partition == Partition::contiguous) return {part(length, ranks, rank)};
  return {part(length, 2 * std::int64_t{ranks}, rank), part(length, 2 * std::int64_t{ranks}, 2 * ranks - 1 - rank)};
}

std::int64_t shard_length(std::int64_t length, int ranks, int rank, Partition partition) {
  std::int64_t rows = 0;
  for (const RowRange& range : shard_rows(length, ranks, rank, partition)) rows += range.end - range.begin;
  return rows;
}

}  // namespace sdpa::distributed
