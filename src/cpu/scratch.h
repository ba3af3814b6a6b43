// Memory for the kernels' parallel regions. Two ways memory running out would end the
// process where the library promises an error the caller can catch (std::bad_alloc):
// an exception may not leave an OpenMP region (the runtime calls std::terminate), and
// Highway's AllocateAligned returns null instead of throwing. So each thread's scratch
// is made before the region, in the calling thread, and every aligned allocation is
// checked.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <vector>

#include "hwy/aligned_allocator.h"

namespace sdpa::detail {

// hwy::AllocateAligned that throws std::bad_alloc instead of returning null.
template <class T>
hwy::AlignedFreeUniquePtr<T[]> allocate_aligned(std::size_t count) {
  hwy::AlignedFreeUniquePtr<T[]> memory = hwy::AllocateAligned<T>(count);
  if (!memory) throw std::bad_alloc();
  return memory;
}

// One Scratch(args...) per thread of a region of `threads` threads (at least one), for
// thread omp_get_thread_num() to use. The pages are touched by whichever thread writes
// them first, so on a multi-socket machine buffers that are written before they are read
// (all of them here but the portable kernels' zero-initialised vectors) still land near
// their thread.
template <class Scratch, class... Args>
std::vector<std::unique_ptr<Scratch>> scratch_per_thread(int threads, const Args&... args) {
  std::vector<std::unique_ptr<Scratch>> scratch;
  for (int t = 0; t < std::max(threads, 1); ++t) scratch.push_back(std::make_unique<Scratch>(args...));
  return scratch;
}

// Scratch is kept between calls only for head dims up to this: a model's head dims make
// buffers of tens to hundreds of KB a thread; a call with a huge one should not hold its
// memory after.
constexpr std::int64_t kLargestKeptDim = 1024;

// The per-thread scratch of a calling thread's last call, kept for its next call while
// `Key` (whatever the Scratch's sizes depend on) stays the same: a model's small heads
// call thousands of times, and making the buffers per call was the largest part of a tiny
// call's fixed cost (docs/performance.md, "Small problems"). One per calling thread
// (thread_local at the use), so calls from several threads never share one.
template <class Scratch, class Key>
class ScratchCache {
 public:
  // At least `threads` scratches made from `args...`, remade when the key changes.
  template <class... Args>
  const std::vector<std::unique_ptr<Scratch>>& Get(const Key& key, int threads, const Args&... args) {
    if (key_ != key || static_cast<int>(of_thread_.size()) < threads) {
      of_thread_.clear();  // before the new ones are made: never both at once
      key_.reset();
      of_thread_ = scratch_per_thread<Scratch>(threads, args...);
      key_ = key;
    }
    return of_thread_;
  }
  // Frees the memory (a call whose scratch is too large to hold on to).
  void Release() {
    of_thread_.clear();
    key_.reset();
  }

 private:
  std::optional<Key> key_;
  std::vector<std::unique_ptr<Scratch>> of_thread_;
};

}  // namespace sdpa::detail
