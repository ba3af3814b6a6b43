#include "api/varlen.h"

#include <string>

#include "api/resolve_options.h"
#include "api/validate.h"

namespace sdpa::detail {

namespace {

// cu_seqlens: batch + 1 entries from 0 to `total`, never decreasing.
void check_cu_seqlens(const std::vector<std::int64_t>& cu, std::int64_t total, const char* name) {
  if (cu.empty()) fail(name, "expected batch + 1 >= 1 entries, got none");
  if (cu.front() != 0) fail(name, "expected a first entry of 0, got " + std::to_string(cu.front()));
  for (std::size_t b = 1; b < cu.size(); ++b)
    if (cu[b] < cu[b - 1])
      fail(name, "expected non-decreasing entries, got " + std::to_string(cu[b - 1]) + " then " +
                     std::to_string(cu[b]) + " at index " + std::to_string(b));
  if (cu.back() != total)
    fail(name, "expected a last entry equal to the packed length " + std::to_string(total) + ", got " +
                   std::to_string(cu.back()));
}

struct PackedSizes {
  std::int64_t heads_q, heads_kv, total_q, total_k, E, Ev, batch;
};

PackedSizes check_varlen_operands(const TensorView& query, const TensorView& key, const TensorView& value,
                                  const VarlenSequences& sequences, const Options& options) {
  check_options(options, query.dtype);
  check_no_mask(options);
  check_float_operands({{&query, "query"}, {&key, "key"}, {&value, "value"}}, 3, "rank 3 (heads, total, dim)");
  check_kv_scale(key, options.key_scale, "key", "options.key_scale");  // (Hkv, total_k)
  check_kv_scale(value, options.value_scale, "value", "options.value_scale");
  const PackedSizes n{query.shape[0],
                      key.shape[0],
                      query.shape[1],
                      key.shape[1],
                      query.shape[2],
                      value.shape[2],
                      static_cast<std::int64_t>(sequences.cu_seqlens_q.size()) - 1};
  if (key.shape[2] != n.E)
    fail("key", "expected head dim E = " + std::to_string(n.E) + " (the query's), got " + std::to_string(key.shape[2]));
  if (n.E < 1) fail("query", "expected head dim E >= 1, got shape " + shape_string(query.shape));
  if (value.shape[0] != n.heads_kv || value.shape[1] != n.total_k)
    fail("value", "expected (" + std::to_string(n.heads_kv) + ", " + std::to_string(n.total_k) +
                      ", Ev) like the key, got shape " + shape_string(value.shape));
  check_heads(n.heads_q, n.heads_kv, "key");
  check_cu_seqlens(sequences.cu_seqlens_q, n.total_q, "cu_seqlens_q");
  check_cu_seqlens(sequences.cu_seqlens_k, n.total_k, "cu_seqlens_k");
  if (sequences.cu_seqlens_k.size() != sequences.cu_seqlens_q.size())
    fail("cu_seqlens_k", "expected " + std::to_string(sequences.cu_seqlens_q.size()) +
                             " entries (the batch of cu_seqlens_q), got " +
                             std::to_string(sequences.cu_seqlens_k.size()));
  check_per_head_options(options, {n.batch}, n.heads_q, query.dtype);
  return n;
}

}  // namespace

OutputShapes check_varlen_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                                 const VarlenSequences& sequences, const Options& options) {
  const PackedSizes n = check_varlen_operands(query, key, value, sequences, options);
  return {{n.heads_q, n.total_q, n.Ev},
          {n.heads_q, n.total_q},
          query.dtype,
          query.dtype == DType::float64 ? DType::float64 : DType::float32};
}

std::vector<Problem> make_varlen_problems(const TensorView& query, const TensorView& key, const TensorView& value,
                                          const VarlenSequences& sequences, const ForwardOutputs& outputs,
                                          const Options& options) {
  const OutputShapes shapes = check_varlen_inputs(query, key, value, sequences, options);
  check_no_weights(outputs.weights.has_value());
  std::vector<ExpectedView> outs{{&outputs.output, "output", &shapes.output_shape, shapes.output_dtype}};
  if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &shapes.lse_shape, shapes.lse_dtype});
  std::vector<Span> input_spans = per_head_spans(options);
  for (const auto& [view, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}})
    input_spans.push_back(check_view(*view, name));
  check_outputs(outs, input_spans);

  const std::vector<std::int64_t>& cu_q = sequences.cu_seqlens_q;
  const std::vector<std::int64_t>& cu_k = sequences.cu_seqlens_k;
  std::vector<Problem> problems;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const TensorView q = sequence_view(query, cu_q[b], cu_q[b + 1] - cu_q[b]);
    const TensorView k = sequence_view(key, cu_k[b], cu_k[b + 1] - cu_k[b]);
    const TensorView v = sequence_view(value, cu_k[b], cu_k[b + 1] - cu_k[b]);
    Options sequence = sequence_options(options, static_cast<std::int64_t>(b));
    if (options.key_scale) sequence.key_scale = sequence_view(*options.key_scale, cu_k[b], cu_k[b + 1] - cu_k[b]);
    if (options.value_scale) sequence.value_scale = sequence_view(*options.value_scale, cu_k[b], cu_k[b + 1] - cu_k[b]);
    ForwardOutputs slices{sequence_view(outputs.output, cu_q[b], cu_q[b + 1] - cu_q[b]), std::nullopt, std::nullopt};
    if (outputs.lse) slices.lse = sequence_view(*outputs.lse, cu_q[b], cu_q[b + 1] - cu_q[b]);
    Problem p = make_problem(check_inputs(q, k, v, sequence), slices);
    p.first_batch = static_cast<std::int64_t>(b);
    problems.push_back(std::move(p));
  }
  return problems;
}

std::vector<SequenceBackward> make_varlen_backward_problems(const BackwardInputs& inputs,
                                                            const VarlenSequences& sequences,
                                                            const BackwardOutputs& outputs, const Options& options) {
  check_not_quantized(inputs.key, inputs.value, kBackwardOfInt8);
  const OutputShapes shapes = check_varlen_inputs(inputs.query, inputs.key, inputs.value, sequences, options);
  if (outputs.grad_mask) fail("grad_mask", "expected no buffer for a packed call (it takes no mask), got one");
  // The whole call first: shapes, dtypes, no output overlapping an input or another output.
  std::vector<Span> input_spans = per_head_spans(options);
  for (const auto& [view, name] : {std::pair{&inputs.query, "query"}, {&inputs.key, "key"}, {&inputs.value, "value"}})
    input_spans.push_back(check_view(*view, name));
  check_backward_reads(inputs, shapes.output_shape, shapes.lse_shape, shapes.output_dtype, shapes.lse_dtype,
                       input_spans);
  const DType dtype = inputs.query.dtype;
  std::vector<ExpectedView> outs{{&outputs.grad_query, "grad_query", &inputs.query.shape, dtype},
                                 {&outputs.grad_key, "grad_key", &inputs.key.shape, dtype},
                                 {&outputs.grad_value, "grad_value", &inputs.value.shape, dtype}};
  expect_grad_sinks(outputs, options, outs);
  check_outputs(outs, input_spans);

  const std::vector<std::int64_t>& cu_q = sequences.cu_seqlens_q;
  const std::vector<std::int64_t>& cu_k = sequences.cu_seqlens_k;
  std::vector<SequenceBackward> calls;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const std::int64_t q0 = cu_q[b], L = cu_q[b + 1] - q0, k0 = cu_k[b], S = cu_k[b + 1] - k0;
    BackwardInputs sequence{sequence_view(inputs.query, q0, L), sequence_view(inputs.key, k0, S),
                            sequence_view(inputs.value, k0, S), sequence_view(inputs.output, q0, L),
                            sequence_view(inputs.lse, q0, L),   sequence_view(inputs.grad_output, q0, L)};
    if (inputs.grad_lse) sequence.grad_lse = sequence_view(*inputs.grad_lse, q0, L);
    BackwardOutputs gradients{sequence_view(outputs.grad_query, q0, L), sequence_view(outputs.grad_key, k0, S),
                              sequence_view(outputs.grad_value, k0, S)};
    const Options sequence_opts = sequence_options(options, static_cast<std::int64_t>(b));
    const CheckedInputs checked = check_inputs(sequence.query, sequence.key, sequence.value, sequence_opts);
    SequenceBackward call{make_backward_problem(checked, sequence, gradients).problem, gradients};
    call.problem.first_batch = static_cast<std::int64_t>(b);
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace sdpa::detail
