// float16 and bfloat16 <-> float32 conversions, bit-exact and portable (no F16C needed).
#pragma once

#include <cstdint>
#include <cstring>

namespace sdpa::detail {

inline float bits_to_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// bfloat16 is the top half of a float32.
inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t{h} << 16); }

// Round to nearest, ties to even; NaN stays NaN (quiet bit forced so that rounding
// cannot carry a NaN payload into infinity).
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf/NaN
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_to_float(sign);  // signed zero
  // Subnormal: value = mantissa * 2^-24, exact in float32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

// Round to nearest, ties to even, with overflow to inf and gradual underflow.
inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t bits = float_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u | static_cast<std::uint16_t>((abs_bits >> 13) & 0x1ffu);
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs_bits < 0x38800000u) {
    // Below the smallest normal (2^-14): subnormal result, quantum 2^-24. Adding
    // 0.5 (2^-1) puts the quantum at the last mantissa bit, so the FPU rounds to even.
    const float shifted = bits_to_float(abs_bits) + 0.5f;
    return sign | static_cast<std::uint16_t>(float_to_bits(shifted) - float_to_bits(0.5f));
  }
  std::uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | static_cast<std::uint16_t>((rounded - (112u << 23)) >> 13);
}

}  // namespace sdpa::detail
