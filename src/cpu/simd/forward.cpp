// The fast CPU forward for float32, bfloat16 and float16 inputs (float32 arithmetic):
// Google Highway, compiled once per x86 target (AVX-512, AVX2, SSE4, scalar) and
// picked at run time. This file is the dispatch: which blocking (subtiles of 1, 2 or 3
// row vectors), which path (the vdpbf16ps tiles, the decode row kernels, float32 tiles),
// the split of a call into tasks and their threads. How one task computes (the
// transposed layout, the online softmax, the decode rows) is simd/forward_task-inl.h.
#include "cpu/simd/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/problem.h"
#include "cpu/scratch.h"
#include "cpu/simd/bf16_kernels.h"
#include "cpu/work_split.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/forward.cpp"
#include "hwy/aligned_allocator.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Per-target headers go after highway.h, inside the foreach_target loop.
#include "cpu/simd/decode_rows-inl.h"  // kFewRows, kDecodeKeyTile
#include "cpu/simd/forward_task-inl.h"
#include "cpu/simd/microkernels-inl.h"  // kSubtiles

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {

// The problems of one call in one parallel region (work_split.h: schedule_forward), in
// subtiles of kVectors row vectors.
template <std::size_t kVectors>
void Forward(const Problem* problems, std::int64_t count, bool bf16_path) {
  const Problem& first = problems[0];
  const std::int64_t rows_per_task = kSubtiles * static_cast<std::int64_t>(kVectors * hn::Lanes(DF()));
  const std::int64_t state_size = kSubtiles * StateSize<kVectors>(first);  // one task's rows, one split
  // (Splits of whole decode tiles, a multiple of kKeyTile too: no split ends a tile short.)
  const ForwardSchedule schedule = schedule_forward(problems, count, rows_per_task, kDecodeKeyTile, state_size);
  if (schedule.plans.empty()) return;
  const int threads = Problem::threads_for(schedule.work, first.num_threads, omp_get_max_threads());
  // (m, l, Oᵀ) per (task, split) of the problems that split; aligned for whole-vector loads.
  const hwy::AlignedFreeUniquePtr<float[]> states =
      allocate_aligned<float>(std::max<std::int64_t>(schedule.state_floats, 1));

  // Each task owns its rows of every output and computes them the same way whichever
  // thread runs it: bitwise the same results for any thread count.
  const auto run_unit = [&](Scratch<kVectors>& scratch, std::int64_t u) {
    const ForwardPlan& plan = schedule.plan_of_unit(u);
    Task<kVectors> task(*plan.p, scratch, bf16_path);
    const std::int64_t t = (u - plan.first_unit) / plan.splits, split = (u - plan.first_unit) % plan.splits;
    std::int64_t b, head_kv, row0;
    plan.locate(t, rows_per_task, &b, &head_kv, &row0);
    const std::int64_t rows = std::min(rows_per_task, plan.group_rows - row0);
    if (plan.splits == 1) {
      task.Run(b, head_kv, row0, rows);
      return;
    }
    std::int64_t key_begin, key_end;
    plan.split_range(split, &key_begin, &key_end);
    task.Attend(b, head_kv, row0, rows, key_begin, key_end);
    task.SaveState(states.get() + plan.first_state + (t * plan.splits + split) * state_size);
  };
  const auto run_merge = [&](Scratch<kVectors>& scratch, std::int64_t m) {
    const ForwardPlan& plan = schedule.plan_of_merge(m);
    Task<kVectors> task(*plan.p, scratch, bf16_path);
    const std::int64_t t = m - plan.first_merge;
    std::int64_t b, head_kv, row0;
    plan.locate(t, rows_per_task, &b, &head_kv, &row0);
    task.MergeAndStore(b, head_kv, row0, std::min(rows_per_task, plan.group_rows - row0),
                       states.get() + plan.first_state + t * plan.splits * state_size, plan.splits);
  };

  thread_local ScratchCache<Scratch<kVectors>, ScratchKey> cache;
  const bool parallel = schedule.units > 1 && threads > 1;
  const ScratchKey key{first.E, first.Ev, bf16_path, first.key.dtype == DType::int8, first.dropout_p > 0.0};
  const std::vector<std::unique_ptr<Scratch<kVectors>>>& scratch_of_thread =
      cache.Get(key, parallel ? threads : 1, first, bf16_path);
  if (!parallel) {
    // One thread runs it all without entering an OpenMP region: even a team of one costs
    // libgomp's team setup and a futex call, a fifth of a (1, 1, 1, 8) call's CPU time
    // (docs/performance.md, "Threads"). Plain loops: an orphaned `omp for` here would
    // bind to the caller's own parallel region, if any, and share out its iterations
    // among the caller's threads (CpuForward.CallsFromTheCallersParallelRegion...).
    for (std::int64_t u = 0; u < schedule.units; ++u) run_unit(*scratch_of_thread[0], u);
    for (std::int64_t m = 0; m < schedule.merges; ++m) run_merge(*scratch_of_thread[0], m);
  } else {
#pragma omp parallel num_threads(threads)
    {
      Scratch<kVectors>& scratch = *scratch_of_thread[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t u = 0; u < schedule.units; ++u) run_unit(scratch, u);
      if (schedule.merges > 0) {
#pragma omp for schedule(dynamic, 1)
        for (std::int64_t m = 0; m < schedule.merges; ++m) run_merge(scratch, m);
      }
    }
  }
  if (std::max(first.E, first.Ev) > kLargestKeptDim) cache.Release();
}

// Whether a problem runs faster in subtiles of 3 row vectors (AVX-512: 8 keys × 3 vectors
// in Q·Kᵀ, 8 dims × 3 vectors in P·V) than of 2 (12 keys × 2, 8 dims × 2). The wider
// block loads each K and V element once per 48 query rows instead of 32 and issues fewer
// instructions per FMA: a fifth less time at L = S = 2048 on the Cascade Lake Xeon of
// bench/RESULTS.md (docs/performance.md). It pays when every KV head's group of query
// rows fills 48-row subtiles with at most 1/16 of the lanes padding, and when the
// problem has enough of the larger tasks (192 rows) to share among threads. Decided per
// problem, from its shape alone: the blocking groups rows into subtiles differently
// (which rows see 0·V of a key only a neighbour sees, NaN if V is; which task is short
// enough for the decode kernels), so a varlen sequence must get the blocking it
// gets alone.
constexpr std::int64_t kThreeVectorMinTasks = 16;
bool ThreeVectorsPay(const Problem& p, std::int64_t lanes) {
  if (p.heads_kv == 0) return false;
  const std::int64_t rows = p.heads_q / p.heads_kv * p.L, task_rows = kSubtiles * 3 * lanes;
  if (rows == 0 || (RoundUp(rows, 3 * lanes) - rows) * 16 > rows) return false;
  return p.batch * p.heads_kv * ((rows + task_rows - 1) / task_rows) >= kThreeVectorMinTasks;
}

// Decoding — a KV head's group of query rows (Hq/Hkv · L, 4 for Hq = 32, Hkv = 8, L = 1)
// fits in one vector — runs subtiles of one row vector: with two, the second vector's
// lanes are all padding, and every key costs twice the FMAs (Q·Kᵀ and P·V) for nothing.
// The bfloat16 microkernels (where bf16::chosen(); elsewhere bfloat16 is widened and takes
// the float32 paths below) are written for two; a decode of at most kFewRows rows a KV
// head leaves them for the row kernels (decode_rows-inl.h), whose lanes run along E and
// Ev: no padding lanes. Their scores take vdpbf16ps too (bf16::row_scores); their P·V
// stays in float32, P not rounded to bfloat16 (docs/performance.md, "Decoding": rounded,
// a few-row task's error broke the bfloat16 tolerance rule on 2 of 8,000 `sdpa check`
// cases).
void ForwardFloat32(const Problem* problems, std::int64_t count) {
  if (count == 0) return;
  // (int8 K/V take the float32 path: their tiles widen to float32, exactly.)
  const Problem& first = problems[0];
  const auto group_rows = [](const Problem& p) { return p.heads_kv == 0 ? 0 : p.heads_q / p.heads_kv * p.L; };
  // Runs of consecutive problems (varlen sequences) alike in `key`, each in one call of
  // `run` (a sequence's path, and so its bits, are those it gets alone).
  const auto by_runs = [&](auto key, auto run) {
    for (std::int64_t begin = 0, end; begin < count; begin = end) {
      const auto value = key(problems[begin]);
      for (end = begin + 1; end < count && key(problems[end]) == value;) ++end;
      run(problems + begin, end - begin, value);
    }
  };
  if (kBf16KernelsFit && first.query.dtype == DType::bfloat16 && first.key.dtype == DType::bfloat16 &&
      first.value.dtype == DType::bfloat16 && bf16::chosen()) {
    by_runs([&](const Problem& p) { return group_rows(p) <= kFewRows; },
            [](const Problem* run, std::int64_t n, bool decode) {
              if (decode)
                Forward<1>(run, n, false);
              else
                Forward<2>(run, n, true);
            });
    return;
  }
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(DF()));
  if (std::all_of(problems, problems + count, [&](const Problem& p) { return group_rows(p) <= lanes; })) {
    Forward<1>(problems, count, false);
    return;
  }
  if constexpr (HWY_MAX_BYTES == 64) {
    by_runs([&](const Problem& p) { return ThreeVectorsPay(p, lanes); },
            [](const Problem* run, std::int64_t n, bool three) {
              if (three)
                Forward<3>(run, n, false);
              else
                Forward<2>(run, n, false);
            });
    return;
  }
  Forward<2>(problems, count, false);
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

bool Bfloat16OnVdpbf16ps() { return kBf16KernelsFit && bf16::chosen(); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_EXPORT(ForwardFloat32);
HWY_EXPORT(TargetName);
HWY_EXPORT(Bfloat16OnVdpbf16ps);

void simd_forward_float32(const Problem* problems, std::int64_t count) {
  HWY_DYNAMIC_DISPATCH(ForwardFloat32)(problems, count);
}

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

bool simd_bfloat16_on_vdpbf16ps() { return HWY_DYNAMIC_DISPATCH(Bfloat16OnVdpbf16ps)(); }

}  // namespace sdpa::detail
#endif
