#include "cpu/dispatch.h"

#include <stdexcept>

#include "cpu/portable/kernels.h"
#include "cpu/simd/kernels.h"

namespace sdpa::detail {

bool cpu_forward_resumable(bool float64) { return float64; }

void cpu_forward(const Problem* problems, std::int64_t count) {
  if (count == 0) return;
  if (cpu_forward_resumable(problems[0].float64)) {
    portable_forward(problems, count);
    return;
  }
  // The SIMD kernels finish every row in the call: a carried state would be ignored and
  // the chunk's output taken for the whole row's (a silent wrong answer).
  for (std::int64_t k = 0; k < count; ++k)
    if (problems[k].carried.present()) throw std::logic_error("cpu_forward: a carried problem on the SIMD kernels");
  simd_forward_float32(problems, count);
}

void cpu_backward(const BackwardProblem& problem) {
  if (problem.float64)
    portable_backward(problem);
  else
    simd_backward_float32(problem);
}

std::string cpu_kernel_name() {
  return std::string("simd-") + simd_target_name() + " (float32/bfloat16/float16, bfloat16 " +
         (cpu_bfloat16_on_vdpbf16ps() ? "on vdpbf16ps" : "widened to float32") + "), tiled-portable (float64)";
}

bool cpu_bfloat16_on_vdpbf16ps() { return simd_bfloat16_on_vdpbf16ps(); }

}  // namespace sdpa::detail
