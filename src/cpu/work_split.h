// How the SIMD kernels cut a call into tasks for the threads: the forward's query tiles
// and key splits, the backward's key chunks and query blocks. The cuts depend on the
// shapes (and for the backward's chunks on the thread count, which its results do not
// depend on): every output element is computed by one task in one order, so results
// are bitwise the same for any thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "common/backward_problem.h"
#include "common/problem.h"

namespace sdpa::detail {

// Decoding (few query rows per KV head, few tasks, long S) would leave threads idle:
// such problems split the keys into ranges of whole tiles, attend each range separately
// and merge by log-sum-exp. The count depends on the shape only, never on the threads.
std::int64_t forward_key_splits(const Problem& p, std::int64_t tasks);

// One problem's share of a forward call: tasks of `rows_per_task` flattened (group
// heads × L) rows per KV head, each split into `splits` key ranges.
struct ForwardPlan {
  const Problem* p;
  std::int64_t group_rows, tiles, tasks, splits, split_keys;
  std::int64_t first_unit;   // its first (task, split) in the call's numbering
  std::int64_t first_merge;  // its first task in the merge pass (splits > 1 only)
  std::int64_t first_state;  // its first float in the call's split states

  // Task t: its batch, KV head and first row. Causal: the last (costliest) tiles go
  // first, so that dynamic scheduling ends balanced.
  void locate(std::int64_t t, std::int64_t rows_per_task, std::int64_t* b, std::int64_t* head_kv,
              std::int64_t* row0) const;
  // Keys [*begin, *end) of a split: whole tiles, the last split takes the rest.
  void split_range(std::int64_t split, std::int64_t* begin, std::int64_t* end) const;
};

// The problems of one forward call (one, or a varlen or paged call's sequences) run in
// one parallel region, so that many short sequences keep the threads busy without a
// thread team's start per sequence. Each problem's key splits are its own, as if it ran
// alone: results are bitwise those of running it alone.
struct ForwardSchedule {
  std::vector<ForwardPlan> plans;  // problems with rows only
  std::int64_t units = 0;          // (task, split) pairs
  std::int64_t merges = 0;         // tasks whose splits are merged
  std::int64_t state_floats = 0;   // split states of the problems that split
  double work = 0;                 // the call's flops, for the thread count

  const ForwardPlan& plan_of_unit(std::int64_t unit) const;
  // Merge tasks number only the problems that split.
  const ForwardPlan& plan_of_merge(std::int64_t merge) const;
};

// `state_floats_per_split`: one task's split state (its rows' m, l and Oᵀ).
ForwardSchedule schedule_forward(const Problem* problems, std::int64_t count, std::int64_t rows_per_task,
                                 std::int64_t key_tile, std::int64_t state_floats_per_split);

// The backward's tasks: (batch, KV head, key chunk), each owning dK and dV of its keys;
// with more than one chunk a second pass of (batch, KV head, query block) computes dQ.
struct BackwardSchedule {
  std::int64_t heads;       // batch × KV heads
  std::int64_t chunk_keys;  // keys per chunk: whole key tiles
  std::int64_t chunks;
  std::int64_t group_rows;  // flattened (group heads × L) query rows per KV head
  std::int64_t blocks;      // query blocks of `block_rows` rows (the dQ pass)
  std::int64_t tasks() const { return heads * chunks; }
};

// More than one chunk only when there are too few (batch, KV head) pairs to give each
// of the `threads` two tasks and the keys are long (chunks cost the second pass for dQ:
// seven products instead of five); chunks are also capped in length, since the per-thread
// dK/dV accumulators hold one. The count may depend on the thread count because the
// gradients do not: chunk boundaries fall on the key-tile grid, each key's dK and dV sum
// the query rows in the same order, and dQ sums the key tiles in the same order, in one
// pass or two.
BackwardSchedule schedule_backward(const BackwardProblem& p, int threads, std::int64_t key_tile,
                                   std::int64_t block_rows);

}  // namespace sdpa::detail
