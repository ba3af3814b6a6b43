// The ordered exchange's chunks (Exchange::ordered): the keys in global order, cut where
// the partition's pieces start, each cut moved down to a multiple of the kernel's key
// tile. The portable kernel's tiles start at multiples of the tile too, so every tile of
// a row's keys lies inside one chunk, whoever owns its keys: fed the chunks in order, the
// resumable kernel visits the tiles one single-process call would. A chunk astride a
// piece boundary is filled from both owners (segments).
#pragma once

#include <cstdint>
#include <vector>

#include "sdpa/distributed.h"

namespace sdpa::distributed::detail {

// Global keys [global, global + rows), rows [local, local + rows) of rank owner's shard.
struct Segment {
  int owner = 0;
  std::int64_t global = 0, local = 0, rows = 0;
};

// Keys [begin, end), filled by its segments in key order.
struct Chunk {
  std::int64_t begin = 0, end = 0;
  std::vector<Segment> segments;
};

// The chunks of a sequence of `length` keys in partition `partition` over `ranks`: in
// increasing key order, every key in exactly one, none empty, each begin a multiple of
// `tile`.
std::vector<Chunk> ordered_chunks(std::int64_t length, int ranks, Partition partition, std::int64_t tile);

}  // namespace sdpa::distributed::detail
