// A shape as the layers' error messages print it: "(2, 8, 64)".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sdpa::nn::detail {

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t d = 0; d < shape.size(); ++d) text += (d > 0 ? ", " : "") + std::to_string(shape[d]);
  return text + ")";
}

}  // namespace sdpa::nn::detail
