#include "cpu/dispatch.h"

#include "cpu/portable/kernels.h"
#include "cpu/simd/kernels.h"

namespace sdpa::detail {

void cpu_forward(const Problem* problems, std::int64_t count) {
  if (count > 0 && problems[0].float64)
    portable_forward(problems, count);
  else
    simd_forward_float32(problems, count);
}

void cpu_backward(const BackwardProblem& problem) {
  if (problem.float64)
    portable_backward(problem);
  else
    simd_backward_float32(problem);
}

std::string cpu_kernel_name() {
  return std::string("simd-") + simd_target_name() + " (float32/bfloat16/float16), tiled-portable (float64)";
}

}  // namespace sdpa::detail
