// Xavier / Glorot initialisation (Glorot & Bengio, AISTATS 2010): weights whose variance
// 2 / (fan_in + fan_out) keeps activations and gradients at the same scale through the
// layer. Random numbers come from Philox4x32-10 keyed by the seed, one counter per
// element, so the weights are a pure function of (seed, shape).
#include "sdpa/nn.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "common/philox.h"
#include "sdpa/error.h"

namespace sdpa::nn {
namespace {

struct Fans {
  double fan_in, fan_out;
};

// torch.nn.init._calculate_fan_in_and_fan_out: a weight is (out, in, *receptive field).
Fans fans(const TensorView& w) {
  if (w.rank() < 2) {
    throw Error(
        ErrorKind::value, "weight",
        "expected rank >= 2 (out, in, ...) to compute fan-in and fan-out, got rank " + std::to_string(w.rank()));
  }
  double receptive = 1;
  for (std::size_t d = 2; d < w.rank(); ++d) receptive *= static_cast<double>(w.shape[d]);
  return {static_cast<double>(w.shape[1]) * receptive, static_cast<double>(w.shape[0]) * receptive};
}

// Four 32-bit words for element i: counter (low, high 32 bits of i, 0, 0), key = seed.
detail::PhiloxBlock words(std::uint64_t seed, std::uint64_t i) {
  return detail::philox4x32_10({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), 0u, 0u},
                               static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// A double in [0, 1) from the top 53 of 64 random bits.
double unit(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t bits = (std::uint64_t{hi} << 32) | lo;
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Writes value(i) into element i (row-major order) of a float32/float64 view.
template <class F>
void fill(const TensorView& w, F value) {
  if (w.dtype != DType::float32 && w.dtype != DType::float64) {
    throw Error(ErrorKind::type, "weight", std::string("expected float32 or float64, got ") + dtype_name(w.dtype));
  }
  const std::int64_t count = w.numel();
  if (count == 0) return;
  if (w.data == nullptr) throw Error(ErrorKind::value, "weight", "expected data, got a null pointer");
  const std::vector<std::int64_t> strides = w.effective_strides();
  std::vector<std::int64_t> index(w.rank(), 0);
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const double v = value(static_cast<std::uint64_t>(i));
    if (w.dtype == DType::float32) {
      static_cast<float*>(w.data)[offset] = static_cast<float>(v);
    } else {
      static_cast<double*>(w.data)[offset] = v;
    }
    for (std::size_t d = w.rank(); d-- > 0;) {
      if (++index[d] < w.shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= (w.shape[d] - 1) * strides[d];
      index[d] = 0;
    }
  }
}

}  // namespace

// U(−a, a), a = gain · sqrt(6 / (fan_in + fan_out)): x = a (2u − 1), u ∈ [0, 1).
void xavier_uniform(const TensorView& weight, std::uint64_t seed, double gain) {
  const Fans f = fans(weight);
  const double a = gain * std::sqrt(6.0 / (f.fan_in + f.fan_out));
  fill(weight, [&](std::uint64_t i) {
    const detail::PhiloxBlock r = words(seed, i);
    return a * (2.0 * unit(r[0], r[1]) - 1.0);
  });
}

// N(0, σ²), σ = gain · sqrt(2 / (fan_in + fan_out)), by Box–Muller:
// z = sqrt(−2 ln(1 − u1)) cos(2π u2); 1 − u1 ∈ (0, 1], so the log is finite.
void xavier_normal(const TensorView& weight, std::uint64_t seed, double gain) {
  const Fans f = fans(weight);
  const double sigma = gain * std::sqrt(2.0 / (f.fan_in + f.fan_out));
  fill(weight, [&](std::uint64_t i) {
    const detail::PhiloxBlock r = words(seed, i);
    const double u1 = unit(r[0], r[1]), u2 = unit(r[2], r[3]);
    return sigma * std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * std::numbers::pi * u2);
  });
}

}  // namespace sdpa::nn
