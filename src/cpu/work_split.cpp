#include "cpu/work_split.h"

#include <algorithm>

namespace sdpa::detail {

namespace {

std::int64_t round_up(std::int64_t n, std::int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

std::int64_t forward_key_splits(const Problem& p, std::int64_t tasks) {
  constexpr std::int64_t kMinKeysPerSplit = 2048, kTargetTasks = 32;
  if (tasks >= kTargetTasks || p.S < 2 * kMinKeysPerSplit) return 1;
  return std::min((kTargetTasks + tasks - 1) / tasks, p.S / kMinKeysPerSplit);
}

void ForwardPlan::locate(std::int64_t t, std::int64_t rows_per_task, std::int64_t* b, std::int64_t* head_kv,
                         std::int64_t* row0) const {
  *head_kv = (t / tiles) % p->heads_kv;
  *b = t / (tiles * p->heads_kv);
  *row0 = (tiles - 1 - t % tiles) * rows_per_task;
}

void ForwardPlan::split_range(std::int64_t split, std::int64_t* begin, std::int64_t* end) const {
  *begin = split * split_keys;
  *end = split == splits - 1 ? p->S : std::min(p->S, *begin + split_keys);
}

namespace {

// The plan of unit u (or merge task u): the last whose first is <= u.
const ForwardPlan& plan_at(const std::vector<ForwardPlan>& plans, std::int64_t u,
                           std::int64_t ForwardPlan::*first_of) {
  const auto it = std::upper_bound(plans.begin(), plans.end(), u,
                                   [first_of](std::int64_t x, const ForwardPlan& plan) { return x < plan.*first_of; });
  return *(it - 1);
}

}  // namespace

const ForwardPlan& ForwardSchedule::plan_of_unit(std::int64_t unit) const {
  return plan_at(plans, unit, &ForwardPlan::first_unit);
}

// A problem that does not split adds no merge task, so the last plan starting at or
// before `merge` is one that splits.
const ForwardPlan& ForwardSchedule::plan_of_merge(std::int64_t merge) const {
  return plan_at(plans, merge, &ForwardPlan::first_merge);
}

ForwardSchedule schedule_forward(const Problem* problems, std::int64_t count, std::int64_t rows_per_task,
                                 std::int64_t key_tile, std::int64_t state_floats_per_split) {
  ForwardSchedule schedule;
  for (std::int64_t n = 0; n < count; ++n) {
    const Problem& p = problems[n];
    if (p.batch * p.heads_q * p.L == 0) continue;  // no rows
    ForwardPlan plan{&p, (p.heads_q / p.heads_kv) * p.L, 0, 0, 1, 0,
                     schedule.units, schedule.merges, schedule.state_floats};
    plan.tiles = (plan.group_rows + rows_per_task - 1) / rows_per_task;
    plan.tasks = p.batch * p.heads_kv * plan.tiles;
    plan.splits = forward_key_splits(p, plan.tasks);
    plan.split_keys = round_up(p.S / plan.splits, key_tile);
    // Rounding up to whole tiles can leave the last splits no keys (S = 67616 in 32
    // splits of 2304: 29 full, one short, two empty): as many splits as the keys fill.
    if (plan.splits > 1) plan.splits = (p.S + plan.split_keys - 1) / plan.split_keys;
    schedule.units += plan.tasks * plan.splits;
    if (plan.splits > 1) {
      schedule.merges += plan.tasks;
      schedule.state_floats += plan.tasks * plan.splits * state_floats_per_split;
    }
    schedule.work += p.work();
    schedule.plans.push_back(plan);
  }
  return schedule;
}

BackwardSchedule schedule_backward(const BackwardProblem& p, int threads, std::int64_t key_tile,
                                   std::int64_t block_rows) {
  constexpr std::int64_t kMinChunkKeys = 2048, kMaxChunkKeys = 16384;
  BackwardSchedule schedule{};
  schedule.heads = p.batch * p.heads_kv;
  const std::int64_t target_tasks = 2 * static_cast<std::int64_t>(threads);
  std::int64_t wanted = 1;
  if (schedule.heads < target_tasks && p.S >= 2 * kMinChunkKeys)
    wanted = std::min((target_tasks + schedule.heads - 1) / schedule.heads, p.S / kMinChunkKeys);
  wanted = std::max(wanted, (p.S + kMaxChunkKeys - 1) / kMaxChunkKeys);
  schedule.chunk_keys = round_up((p.S + wanted - 1) / wanted, key_tile);
  schedule.chunks = (p.S + schedule.chunk_keys - 1) / schedule.chunk_keys;
  schedule.group_rows = (p.heads_q / p.heads_kv) * p.L;
  schedule.blocks = (schedule.group_rows + block_rows - 1) / block_rows;
  return schedule;
}

}  // namespace sdpa::detail
