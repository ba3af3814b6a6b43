#include "dist/chunks.h"

#include <algorithm>

#include "dist/shards.h"

namespace sdpa::distributed::detail {

std::vector<Chunk> ordered_chunks(std::int64_t length, int ranks, Partition partition, std::int64_t tile) {
  std::vector<Segment> pieces;  // every rank's pieces, in key order
  for (int r = 0; r < ranks; ++r)
    for (const Piece& piece : shard_pieces(length, ranks, r, partition))
      if (piece.rows > 0) pieces.push_back({r, piece.global, piece.local, piece.rows});
  std::sort(pieces.begin(), pieces.end(), [](const Segment& a, const Segment& b) { return a.global < b.global; });

  std::vector<std::int64_t> cuts{0};
  for (const Segment& piece : pieces)
    if (const std::int64_t cut = piece.global / tile * tile; cut > cuts.back()) cuts.push_back(cut);
  if (length > cuts.back()) cuts.push_back(length);

  std::vector<Chunk> chunks;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    Chunk chunk{cuts[k], cuts[k + 1], {}};
    for (const Segment& piece : pieces) {
      const std::int64_t begin = std::max(chunk.begin, piece.global);
      const std::int64_t end = std::min(chunk.end, piece.global + piece.rows);
      if (begin < end)
        chunk.segments.push_back({piece.owner, begin, piece.local + (begin - piece.global), end - begin});
    }
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

}  // namespace sdpa::distributed::detail
