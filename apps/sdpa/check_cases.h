// `sdpa check`'s random cases: the configurations it draws (dtype, shapes, mask, causal,
// scale, dropout, strides, window, ALiBi, softcap, sinks), the generator that draws them
// and their one-line descriptions. A case depends only on (--seed, its index).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::cli {

using Shape = std::vector<std::int64_t>;

// mt19937_64's output sequence is fixed by the standard but the std:: distributions
// are not, so the distributions are written here: the same --seed gives the same cases
// with every standard library.
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  std::uint64_t below(std::uint64_t n) { return engine_() % n; }
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }
  bool chance(double p) { return uniform() < p; }
  double normal() {  // Box–Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
  }
  template <class T>
  T pick(std::initializer_list<T> choices) {
    return *(choices.begin() + below(choices.size()));
  }

 private:
  std::mt19937_64 engine_;
};

// Case i's generator depends only on (seed, i): a failing case can be rerun alone.
std::uint64_t case_seed(std::uint64_t seed, int index);

enum class MaskKind { none, boolean, additive };

struct CaseConfig {
  DType dtype = DType::float32;
  int rank = 4;
  // Rank 4: (B, H, L, E). Rank 3: the seeds' (batch, L, E) with one head — generated
  // as (H, L, E) with B = 1 and Hq = Hkv, so that its leading dim is the batch.
  std::int64_t B = 1, Hq = 1, Hkv = 1, L = 1, S = 1, E = 1, Ev = 1;
  MaskKind mask_kind = MaskKind::none;
  DType mask_dtype = DType::boolean;
  Shape mask_shape;
  bool mask_expanded = false;     // the CPU gets a stride-0 view of the full shape (pytorch#191937)
  bool fully_masked_row = false;  // one mask row set entirely to false / −inf
  Causal causal = Causal::none;
  std::optional<double> scale;
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  bool strided = false;  // Q, K, V are views of (B, L, H, E + pad) buffers
  int pad = 0;
  bool want_weights = false, want_lse = false;
  // Issue #7: sliding window, its alignment, ALiBi slopes (per head, or per batch and
  // head), logit softcapping; issue #17: attention sinks (per head, or per batch and head).
  std::int64_t window_left = -1, window_right = -1;
  std::optional<Alignment> alignment;
  bool alibi = false, alibi_per_batch = false;
  double softcap = 0.0;
  bool sinks = false, sinks_per_batch = false;

  Shape qkv_shape(std::int64_t heads, std::int64_t rows, std::int64_t cols) const {
    return rank == 4 ? Shape{B, heads, rows, cols} : Shape{heads, rows, cols};
  }
  Shape scores_shape() const { return qkv_shape(Hq, L, S); }
};

// A random case: every feature drawn independently, the oracle's work kept in budget.
CaseConfig random_case(Random& rng);

// The groups a case is counted in (besides "all").
std::vector<std::string> features(const CaseConfig& c);

// "(2,3,4)".
std::string shape_string(const Shape& shape);

// One line: dtype, shapes and every drawn feature.
std::string describe(const CaseConfig& c);

}  // namespace sdpa::cli
