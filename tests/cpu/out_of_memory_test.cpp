// Memory running out in a kernel's scratch is an error the caller can catch
// (std::bad_alloc), with nothing written: not the end of the process. Before cpu/scratch.h
// each thread allocated its scratch inside the OpenMP region, where an exception ends the
// process (std::terminate), and the SIMD kernels' Highway allocations returned null
// unchecked (a segfault). The test caps its own address space (setrlimit, no hook in the
// library) at what the process maps now plus 256 MiB, and asks for a head dim of 2^22:
// the scratch of one 64-key tile of it is 1 GiB, the inputs 16 MiB (allocated first).
// Its own test binary: the cap would disturb other tests' threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <string>

#include "sdpa/sdpa.h"
#include "testing/address_space.h"
#include "testing/rejection.h"

namespace sdpa {
namespace {

using testing::kSentinel;
using testing::untouched;

constexpr std::int64_t kHugeE = std::int64_t{1} << 22;

// Runs `call` with the address space capped at the current mapping plus 256 MiB; returns
// whether it threw std::bad_alloc.
template <class Call>
bool throws_bad_alloc_with_little_memory(const Call& call) {
  testing::AddressSpaceCap cap(std::uint64_t{256} << 20);
  EXPECT_TRUE(cap.active());
  try {
    call();
  } catch (const std::bad_alloc&) {
    return true;
  }
  return false;
}

Tensor filled(DType dtype, const std::vector<std::int64_t>& shape, double value) {
  Tensor t(dtype, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
  return t;
}

class OutOfMemory : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot be set";
#endif
    // The OpenMP threads exist before the cap (their stacks are mapped then).
    const Tensor small = filled(GetParam(), {1, 2, 64, 64}, 0.5);
    (void)forward(small.view(), small.view(), small.view());
  }
};

TEST_P(OutOfMemory, ForwardScratchIsAnErrorAndWritesNothing) {
  const DType dtype = GetParam();
  const Tensor qk = filled(dtype, {1, 2, 1, kHugeE}, 0.25), v = filled(dtype, {1, 2, 1, 8}, 1.0);
  Tensor out = filled(dtype, {1, 2, 1, 8}, kSentinel);
  EXPECT_TRUE(throws_bad_alloc_with_little_memory([&] {
    forward(qk.view(), qk.view(), v.view(), {out.view(), std::nullopt, std::nullopt});
  }));
  EXPECT_TRUE(untouched(out));
  // Memory back: the same call works.
  Tensor small_out(dtype, {1, 2, 1, 8});
  const Tensor q = filled(dtype, {1, 2, 1, 64}, 0.25);
  forward(q.view(), q.view(), v.view(), {small_out.view(), std::nullopt, std::nullopt});
  EXPECT_DOUBLE_EQ(small_out.get(0), 1.0);  // one key: its value
}

TEST_P(OutOfMemory, BackwardScratchIsAnErrorAndWritesNothing) {
  const DType dtype = GetParam();
  const Tensor qk = filled(dtype, {1, 2, 1, kHugeE}, 0.25), v = filled(dtype, {1, 2, 1, 8}, 1.0);
  const Tensor grad_out = filled(dtype, {1, 2, 1, 8}, 1.0);
  const DType lse_dtype = dtype == DType::float64 ? DType::float64 : DType::float32;
  const Tensor lse = filled(lse_dtype, {1, 2, 1}, 0.0);  // one key: lse = its score, 0 is as good
  Tensor dq = filled(dtype, qk.shape(), kSentinel), dk = filled(dtype, qk.shape(), kSentinel);
  Tensor dv = filled(dtype, v.shape(), kSentinel);
  EXPECT_TRUE(throws_bad_alloc_with_little_memory([&] {
    backward({qk.view(), qk.view(), v.view(), v.view(), lse.view(), grad_out.view()},
             {dq.view(), dk.view(), dv.view()});
  }));
  EXPECT_TRUE(untouched(dq) && untouched(dk) && untouched(dv));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OutOfMemory, ::testing::Values(DType::float32, DType::float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace sdpa
