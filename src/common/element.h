// Reading and writing one element of any sdpa dtype as a float or double.
#pragma once

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
  }
}

}  // namespace sdpa::detail
