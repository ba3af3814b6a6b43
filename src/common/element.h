// Reading and writing one element of any sdpa dtype as a float or double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "sdpa/tensor.h"

namespace sdpa::detail {

template <class T>
inline T load_element(const std::byte* p, DType dtype) {
  switch (dtype) {
    case DType::float32: { float v; std::memcpy(&v, p, 4); return static_cast<T>(v); }
    case DType::float64: { double v; std::memcpy(&v, p, 8); return static_cast<T>(v); }
    case DType::float16: { std::uint16_t v; std::memcpy(&v, p, 2); return static_cast<T>(fp16_to_float(v)); }
    case DType::bfloat16: { std::uint16_t v; std::memcpy(&v, p, 2); return static_cast<T>(bf16_to_float(v)); }
    case DType::boolean: return static_cast<T>(*p != std::byte{0});
    case DType::int8: { std::int8_t v; std::memcpy(&v, p, 1); return static_cast<T>(v); }
  }
  return T{};
}

// Stores `value` rounded to `dtype` (round to nearest even).
template <class T>
inline void store_element(std::byte* p, DType dtype, T value) {
  switch (dtype) {
    case DType::float32: { float v = static_cast<float>(value); std::memcpy(p, &v, 4); return; }
    case DType::float64: { double v = static_cast<double>(value); std::memcpy(p, &v, 8); return; }
    case DType::float16: { std::uint16_t v = float_to_fp16(static_cast<float>(value)); std::memcpy(p, &v, 2); return; }
    case DType::bfloat16: { std::uint16_t v = float_to_bf16(static_cast<float>(value)); std::memcpy(p, &v, 2); return; }
    case DType::boolean: *p = value != T{0} ? std::byte{1} : std::byte{0}; return;
    case DType::int8: {  // nearest, saturated to the symmetric range [−127, 127]; NaN → 0
      const double x = static_cast<double>(value);
      const std::int8_t v = static_cast<std::int8_t>(std::isnan(x) ? 0.0 : std::nearbyint(std::clamp(x, -127.0, 127.0)));
      std::memcpy(p, &v, 1);
      return;
    }
  }
}

}  // namespace sdpa::detail
