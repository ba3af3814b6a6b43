// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// a counter-based generator, so a random number is a pure function of (key, counter)
// and any thread can compute any element's dropout decision without shared state.
#pragma once

#include <array>
#include <cstdint>

namespace sdpa::detail {

using PhiloxBlock = std::array<std::uint32_t, 4>;

inline PhiloxBlock philox4x32_10(PhiloxBlock counter, std::uint32_t key0, std::uint32_t key1) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{kMul0} * counter[0];
    const std::uint64_t p1 = std::uint64_t{kMul1} * counter[2];
    counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key0, static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key1, static_cast<std::uint32_t>(p0)};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// splitmix64's finaliser: a bijection of 64-bit integers with mix(0) == 0.
inline std::uint64_t mix64(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The dropout decision of DESIGN.md §1, shared by every backend so that they agree
// bit for bit:
//   key     = seed XOR mix64(offset)                  (offset 0: the seed itself)
//   counter = (j / 4, i, head, batch), 32 bits each
//   word    = Philox4x32-10(counter, key)[j % 4]
//   keep    <=> word >= threshold,  threshold = round(p · 2^32)
// One Philox call serves four neighbouring keys j.
//
// `row0` and `col0` are where a shard's rows and keys start in the whole problem (ring
// attention, src/dist/: each rank computes with local indices): i and j are counted
// from them, so that a shard draws bitwise the mask the single-process call draws.
class DropoutMask {
 public:
  DropoutMask(double p, std::uint64_t seed, std::uint64_t offset, std::int64_t row0 = 0, std::int64_t col0 = 0)
      : row0_(row0), col0_(col0) {
    const std::uint64_t key = seed ^ mix64(offset);
    key0_ = static_cast<std::uint32_t>(key);
    key1_ = static_cast<std::uint32_t>(key >> 32);
    double t = p * 4294967296.0 + 0.5;
    threshold_ = t >= 4294967295.0 ? 0xffffffffu : static_cast<std::uint32_t>(t);
  }

  // The four words for keys 4·(j/4) … 4·(j/4)+3 (j, i counted from col0, row0).
  PhiloxBlock words(std::int64_t batch, std::int64_t head, std::int64_t i, std::int64_t j) const {
    return philox4x32_10({static_cast<std::uint32_t>((j + col0_) >> 2), static_cast<std::uint32_t>(i + row0_),
                          static_cast<std::uint32_t>(head), static_cast<std::uint32_t>(batch)},
                         key0_, key1_);
  }
  bool keep_word(std::uint32_t word) const { return word >= threshold_; }
  bool keep(std::int64_t batch, std::int64_t head, std::int64_t i, std::int64_t j) const {
    return keep_word(words(batch, head, i, j)[(j + col0_) & 3]);
  }

  // Calls keep_key(c, kept) for keys j0 + c, c < count, of row (batch, head, i), in
  // order: one Philox call serves four neighbouring keys. Every kernel draws through it.
  template <class KeepKey>
  void for_each_key(std::int64_t batch, std::int64_t head, std::int64_t i, std::int64_t j0, std::int64_t count,
                    KeepKey&& keep_key) const {
    PhiloxBlock block{};
    for (std::int64_t c = 0; c < count; ++c) {
      const std::int64_t j = j0 + c, lane = (j + col0_) & 3;
      if (c == 0 || lane == 0) block = words(batch, head, i, j);
      keep_key(c, keep_word(block[lane]));
    }
  }

 private:
  std::int64_t row0_, col0_;
  std::uint32_t key0_, key1_, threshold_;
};

}  // namespace sdpa::detail
