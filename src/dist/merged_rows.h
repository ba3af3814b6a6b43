// A rank's query rows merged over pieces of the keys (the ring's steps, the ordered
// exchange's chunks on the SIMD kernels and the reference backend): each block of rows
// is computed against a piece into a partial output and lse, merged into the rows'
// accumulators by the log-sum-exp (merge.h), and once every piece is merged the sinks
// are folded and the rows stored in the output's dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/shards.h"
#include "sdpa/sdpa.h"

namespace sdpa::distributed::detail {

// Runs one piece's problem on the call's backend (nothing to run without rows).
void run_piece(const Problem& p, Backend backend);

// Query rows per block: about eight polls of the exchange per piece, never tiny blocks.
std::int64_t block_rows(std::int64_t rows);

// Acc: the accumulation type (float, or double for float64). Allocates by the call's
// sizes on construction, so that it can be made before the ranks agree (agreement.h).
template <class Acc>
class MergedRows {
 public:
  explicit MergedRows(const ShardCall& call);

  // Computes `p` (its query rows the shard's rows [row0, row0 + rows)) into the partial
  // buffers and merges it into those rows. `call`: the one the rows were made for.
  void compute_and_merge(const ShardCall& call, Problem& p, std::int64_t row0, std::int64_t rows);

  // Folds the sinks into every row, once, and stores the rows into `outputs`.
  void finish(const ShardCall& call, const ForwardOutputs& outputs);

 private:
  std::vector<Acc> acc_out_, acc_lse_;    // output rows (matrices × Lr × Ev) and lse, accumulated
  std::vector<Acc> part_out_, part_lse_;  // one query block's partial output and lse
};

}  // namespace sdpa::distributed::detail
