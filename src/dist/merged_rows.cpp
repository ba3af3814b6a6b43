#include "dist/merged_rows.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "api/operands.h"
#include "cpu/dispatch.h"
#include "dist/merge.h"
#include "reference/attention.h"

namespace sdpa::distributed::detail {

void run_piece(const Problem& p, Backend backend) {
  if (p.batch * p.heads_q * p.L == 0) return;
  if (backend == Backend::reference)
    sdpa::detail::reference_forward(p);
  else
    sdpa::detail::cpu_forward(&p, 1);
}

std::int64_t block_rows(std::int64_t rows) { return std::max<std::int64_t>(64, (rows + 7) / 8); }

template <class Acc>
MergedRows<Acc>::MergedRows(const ShardCall& call) {
  const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
  const std::int64_t block = std::min(block_rows(Lr), Lr);
  acc_out_.assign(static_cast<std::size_t>(matrices * Lr * Ev), Acc{0});
  acc_lse_.assign(static_cast<std::size_t>(matrices * Lr), -std::numeric_limits<Acc>::infinity());
  part_out_.resize(static_cast<std::size_t>(matrices * block * Ev));
  part_lse_.resize(static_cast<std::size_t>(matrices * block));
}

template <class Acc>
void MergedRows<Acc>::compute_and_merge(const ShardCall& call, Problem& p, std::int64_t row0, std::int64_t rows) {
  const DType acc_dtype = std::is_same_v<Acc, double> ? DType::float64 : DType::float32;
  const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
  p.output = sdpa::detail::make_operand(
      packed_view(part_out_.data(), acc_dtype, call.batch_shape, call.heads_q, rows, Ev), call.batch_shape,
      call.heads_q);
  TensorView lse_view = packed_view(part_lse_.data(), acc_dtype, call.batch_shape, call.heads_q, rows, 1);
  lse_view.shape.pop_back();
  lse_view.strides.pop_back();
  p.lse = sdpa::detail::lse_operand(lse_view, call.batch_shape, call.heads_q);
  run_piece(p, call.options.backend);
  for (std::int64_t m = 0; m < matrices; ++m)
    merge_rows(acc_out_.data() + (m * Lr + row0) * Ev, acc_lse_.data() + m * Lr + row0,
               part_out_.data() + m * rows * Ev, part_lse_.data() + m * rows, rows, Ev);
}

template <class Acc>
void MergedRows<Acc>::finish(const ShardCall& call, const ForwardOutputs& outputs) {
  const std::int64_t matrices = call.batch * call.heads_q, Lr = call.L_shard, Ev = call.Ev;
  // The sinks, once per row, after the last merge (merge.h): a piece's partial softmax
  // carries none, or every piece would count them again.
  if (!call.sinks.empty())
    for (std::int64_t m = 0; m < matrices; ++m)
      fold_sink(acc_out_.data() + m * Lr * Ev, acc_lse_.data() + m * Lr,
                static_cast<Acc>(call.sinks[static_cast<std::size_t>(m)]), Lr, Ev);
  // This rank's rows of the output (input dtype) and lse.
  const sdpa::detail::Operand out = sdpa::detail::make_operand(outputs.output, call.batch_shape, call.heads_q);
  for (std::int64_t m = 0; m < matrices; ++m)
    for (std::int64_t i = 0; i < Lr; ++i)
      for (std::int64_t d = 0; d < Ev; ++d)
        out.store<Acc>(m, i, d, acc_out_[static_cast<std::size_t>((m * Lr + i) * Ev + d)]);
  if (outputs.lse) {
    const sdpa::detail::Operand lse = sdpa::detail::lse_operand(*outputs.lse, call.batch_shape, call.heads_q);
    for (std::int64_t m = 0; m < matrices; ++m)
      for (std::int64_t i = 0; i < Lr; ++i) lse.store<Acc>(m, i, 0, acc_lse_[static_cast<std::size_t>(m * Lr + i)]);
  }
}

template class MergedRows<float>;
template class MergedRows<double>;

}  // namespace sdpa::distributed::detail
