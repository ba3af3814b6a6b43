// sdpa::Tensor's storage (detail::TensorAllocator): a buffer of 2 MiB or more mapped on
// its own, on a huge page's boundary, offered to transparent huge pages; smaller ones from
// operator new.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sdpa/tensor.h"

namespace {

using sdpa::DType;
using sdpa::Tensor;

constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;

std::uintptr_t address(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data()); }

// Element i holds i (exact in float32 below 2^24).
void fill_with_indices(Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
}

void expect_indices(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (t.get(i) != static_cast<double>(i)) {
      ADD_FAILURE() << "element " << i << " of " << t.numel() << " reads " << t.get(i);
      return;
    }
}

TEST(TensorStorage, LargeBuffersStartOnAHugePageAndHoldWhatIsWritten) {
  // 2 MiB exactly, just over, and several huge pages and a bit (the unmapped tail).
  for (const std::int64_t count :
       {std::int64_t{1} << 19, (std::int64_t{1} << 19) + 3, 3 * (std::int64_t{1} << 19) + 17}) {
    Tensor t(DType::float32, {count});
    EXPECT_EQ(t.nbytes(), static_cast<std::size_t>(count) * 4);
    EXPECT_EQ(address(t) % kHugePage, 0u) << count;
    for (std::int64_t i = 0; i < count; ++i)
      if (t.get(i) != 0.0) {
        ADD_FAILURE() << "element " << i << " of a new tensor reads " << t.get(i);
        break;
      }
    fill_with_indices(t);
    const Tensor copy = t;  // a storage of its own, as large
    EXPECT_NE(copy.data(), t.data());
    EXPECT_EQ(address(copy) % kHugePage, 0u);
    expect_indices(copy);
  }
}

TEST(TensorStorage, FreeingABufferLeavesTheOthersWhole) {
  // Sizes around the huge page, freed in an order unlike their making: a buffer unmapped
  // too long would take a neighbour's pages with it (and a read of them would fault).
  std::vector<Tensor> kept;
  for (int round = 0; round < 3; ++round)
    for (const std::int64_t count : {(std::int64_t{1} << 21) - 1, std::int64_t{1} << 21, (std::int64_t{1} << 21) + 1,
                                     std::int64_t{5} << 20, std::int64_t{1000}}) {
      Tensor t(DType::int8, {count});
      for (std::int64_t i = 0; i < count; i += 4096) t.set(i, static_cast<double>((i / 4096) % 100));
      kept.push_back(std::move(t));
      if (kept.size() % 3 == 0) kept.erase(kept.begin() + 1);
    }
  for (const Tensor& t : kept)
    for (std::int64_t i = 0; i < t.numel(); i += 4096) ASSERT_EQ(t.get(i), static_cast<double>((i / 4096) % 100));
}

TEST(TensorStorage, SmallBuffersHoldWhatIsWritten) {
  for (const std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, (std::int64_t{1} << 19) - 1}) {
    Tensor t(DType::float32, {count});
    EXPECT_EQ(t.nbytes(), static_cast<std::size_t>(count) * 4);
    fill_with_indices(t);
    expect_indices(Tensor(t));
  }
}

// The line of /proc/self/smaps' entry for the mapping that holds `at` that starts with
// `field`, or "" (no such mapping or field).
std::string smaps_field(std::uintptr_t at, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {  // a mapping's first line
      inside = begin <= at && at < end;
      continue;
    }
    if (inside && line.rfind(field, 0) == 0) return line;
  }
  return "";
}

TEST(TensorStorage, LargeBuffersAreOfferedHugePages) {
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string enabled;
  std::getline(setting, enabled);
  if (enabled.empty() || enabled.find("[never]") != std::string::npos)
    GTEST_SKIP() << "this kernel gives no transparent huge pages (" << enabled << ")";
  const Tensor t(DType::float32, {std::int64_t{1} << 20});
  const std::string eligible = smaps_field(address(t), "THPeligible:");
  if (eligible.empty()) GTEST_SKIP() << "this kernel's smaps has no THPeligible field";
  // Under "madvise" (the setting of many distributions) only a mapping that asked is.
  EXPECT_NE(eligible.find('1'), std::string::npos) << eligible << " (transparent_hugepage: " << enabled << ")";
}

}  // namespace
