// The fast CPU backward for float32, bfloat16 and float16 inputs (float32 arithmetic):
// Google Highway, compiled once per x86 target and picked at run time, as the forward
// (simd/forward.cpp). This file is the dispatch: the tasks of work_split.h's
// schedule_backward (batch, KV head, key chunk; and dQ's query blocks when the keys come
// in chunks) and their threads, each thread's scratch kept between calls. How one task
// computes (the transposed layout, P recomputed from the lse, the five products) is
// simd/backward_task-inl.h.
#include "cpu/simd/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/backward_problem.h"
#include "cpu/scratch.h"
#include "cpu/simd/bf16_kernels.h"
#include "cpu/work_split.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/backward.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Per-target headers go after highway.h, inside the foreach_target loop.
#include "cpu/simd/backward_task-inl.h"
#include "cpu/simd/microkernels-inl.h"  // kSubtiles, kKeyTile

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {

// The tasks of work_split.h's schedule_backward in one parallel region.
void BackwardFloat32(const BackwardProblem& p) {
  const int threads = p.threads(omp_get_max_threads());
  const std::int64_t block_rows = kSubtiles * static_cast<std::int64_t>(2 * hn::Lanes(DF()));
  const BackwardSchedule work = schedule_backward(p, threads, kKeyTile, block_rows);

  const bool parallel = work.tasks() > 1 || work.chunks > 1;
  const bool bf16_path = kBf16KernelsFit && p.query.dtype == DType::bfloat16 && p.key.dtype == DType::bfloat16 &&
                         p.value.dtype == DType::bfloat16 && p.E > 0 && p.Ev > 0 && bf16::chosen();
  thread_local ScratchCache<Scratch, ScratchKey> cache;
  const ScratchKey key{p.E, p.Ev, work.chunk_keys, p.softcap > 0.0, bf16_path};
  const std::vector<std::unique_ptr<Scratch>>& scratch_of_thread =
      cache.Get(key, parallel ? threads : 1, p, work.chunk_keys, bf16_path);
#pragma omp parallel num_threads(threads) if (parallel)
  {
    Scratch& scratch = *scratch_of_thread[static_cast<std::size_t>(omp_get_thread_num())];
    Task task(p, scratch);
    // Causal: the first key chunks are the costliest (every later query sees them), so
    // they go first for dynamic scheduling to end balanced.
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < work.tasks(); ++t) {
      const std::int64_t chunk = t / work.heads, head = t % work.heads;
      const std::int64_t key_begin = chunk * work.chunk_keys, key_end = std::min(p.S, key_begin + work.chunk_keys);
      task.Run(head / p.heads_kv, head % p.heads_kv, key_begin, key_end, /*query_gradient=*/work.chunks == 1);
    }
    if (work.chunks > 1) {
      // dQ over query blocks. Causal: the last blocks see the most keys; they go first.
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t t = 0; t < work.heads * work.blocks; ++t) {
        const std::int64_t head = t / work.blocks, block = work.blocks - 1 - t % work.blocks;
        task.RunQueries(head / p.heads_kv, head % p.heads_kv, block * block_rows,
                        std::min(block_rows, work.group_rows - block * block_rows));
      }
    }
  }
  if (std::max(p.E, p.Ev) > kLargestKeptDim ||
      work.chunk_keys * (scratch_of_thread[0]->E_pad + scratch_of_thread[0]->Ev_pad) > kLargestKeptChunkFloats)
    cache.Release();
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::detail {

HWY_EXPORT(BackwardFloat32);

void simd_backward_float32(const BackwardProblem& problem) { HWY_DYNAMIC_DISPATCH(BackwardFloat32)(problem); }

}  // namespace sdpa::detail
#endif
