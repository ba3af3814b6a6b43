#include "api/sink_gradients.h"

#include <cmath>
#include <limits>

#include "api/views.h"
#include "common/element.h"

namespace sdpa::detail {

void add_sink_gradients(const BackwardProblem& p, double* per_matrix) {
  for (std::int64_t qm = 0; qm < p.batch * p.heads_q; ++qm) {
    const double sink = p.sinks[static_cast<std::size_t>(qm)];
    if (sink == -std::numeric_limits<double>::infinity()) continue;  // no sink: P = 0 (not exp(−inf + inf))
    double sum = 0.0;
    for (std::int64_t i = 0; i < p.L; ++i) {
      double d = p.grad_lse.present() ? p.grad_lse.load<double>(qm, i, 0) : 0.0;
      for (std::int64_t c = 0; c < p.Ev; ++c)
        d -= p.grad_output.load<double>(qm, i, c) * p.output.load<double>(qm, i, c);
      sum += std::exp(sink - p.lse.load<double>(qm, i, 0)) * d;
    }
    per_matrix[qm] += sum;
  }
}

void store_sink_gradients(const std::vector<double>& per_matrix, const TensorView& grad_sinks) {
  if (grad_sinks.numel() == 0) return;  // no heads (Hq = 0) or no batch: nothing to store
  const std::int64_t heads_q = grad_sinks.shape.back();
  const std::int64_t batch = static_cast<std::int64_t>(per_matrix.size()) / heads_q;
  auto* out = static_cast<std::byte*>(grad_sinks.data);
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(grad_sinks.dtype));
  for_each_offset(grad_sinks.shape, grad_sinks.effective_strides(), [&](std::int64_t flat, std::int64_t offset) {
    double value = 0.0;
    if (grad_sinks.rank() == 1)
      for (std::int64_t b = 0; b < batch; ++b) value += per_matrix[static_cast<std::size_t>(b * heads_q + flat)];
    else
      value = per_matrix[static_cast<std::size_t>(flat)];
    store_element<double>(out + offset * element, grad_sinks.dtype, value);
  });
}

}  // namespace sdpa::detail
