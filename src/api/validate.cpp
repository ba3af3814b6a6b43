// A dense call checked and resolved (DESIGN.md §1, "Bad input"): check_inputs before
// any output is sized, make_problem / make_backward_problem once the buffers exist.
#include "api/validate.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "api/operands.h"
#include "api/resolve_options.h"

namespace sdpa::detail {

namespace {

// Layout of one of query/key/value: (batch..., heads, rows, cols). The batch dims are
// the view's leading `batch_rank` sizes, read in place (no copy per check).
struct Dims {
  const TensorView* view;
  std::size_t batch_rank;
  std::int64_t heads, rows, cols;

  Shape batch() const {
    return Shape(view->shape.begin(), view->shape.begin() + static_cast<std::ptrdiff_t>(batch_rank));
  }
  bool same_batch(const Dims& other) const {
    return batch_rank == other.batch_rank &&
           std::equal(view->shape.begin(), view->shape.begin() + static_cast<std::ptrdiff_t>(batch_rank),
                      other.view->shape.begin());
  }
};
// Rank >= 4 is (batch..., heads, rows, cols); rank 3 is the seeds' (batch, rows, cols)
// with one head; rank 2 one matrix.
Dims split(const TensorView& t) {
  const std::size_t r = t.shape.size();
  const std::size_t matrix_dims = r >= 4 ? 3 : 2;
  return {&t, r - matrix_dims, r >= 4 ? t.shape[r - 3] : 1, t.shape[r - 2], t.shape[r - 1]};
}

}  // namespace

void check_kv_scale(const TensorView& tensor, const std::optional<TensorView>& scale, const char* tensor_name,
                    const char* scale_name) {
  const bool quantized = tensor.dtype == DType::int8;
  if (quantized && !scale)
    fail(scale_name, std::string("expected a float32 scale per (token, head) for the int8 ") + tensor_name +
                         " (its shape without the last dim), got none");
  if (!scale) return;
  if (!quantized)
    fail(scale_name, std::string("expected no scale: it goes with an int8 ") + tensor_name + ", and " + tensor_name +
                         " is " + dtype_name(tensor.dtype));
  if (scale->dtype != DType::float32)
    fail(scale_name, std::string("expected float32, got ") + dtype_name(scale->dtype), ErrorKind::type);
  const Shape expected(tensor.shape.begin(), tensor.shape.end() - (tensor.shape.empty() ? 0 : 1));
  if (scale->shape != expected)
    fail(scale_name, "expected shape " + shape_string(expected) + " (the " + tensor_name +
                         "'s without its last dim), got " + shape_string(scale->shape));
  check_view(*scale, scale_name);
}

void check_operand_dtype(const TensorView& view, const char* name, DType query_dtype, bool key_or_value) {
  const bool quantized = key_or_value && view.dtype == DType::int8 && is_float(query_dtype);
  if (!is_float(view.dtype) && !quantized)
    fail(name,
         std::string("expected float16, bfloat16, float32 or float64") +
             (key_or_value ? " (or int8 with a scale)" : "") + ", got " + dtype_name(view.dtype),
         ErrorKind::type);
  if (view.dtype != query_dtype && !quantized)
    fail(name, std::string("expected the query's dtype ") + dtype_name(query_dtype) + ", got " + dtype_name(view.dtype),
         ErrorKind::type);
}

void check_not_quantized(const TensorView& key, const TensorView& value, const std::string& what) {
  for (const auto& [view, name] : {std::pair{&key, "key"}, {&value, "value"}})
    if (view->dtype == DType::int8)
      fail(name, "expected a floating-point " + std::string(name) + ": int8 is not supported by " + what + ", got int8",
           ErrorKind::type);
}

CheckedInputs check_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                           const Options& options) {
  CheckedInputs in;
  in.query = &query;
  in.key = &key;
  in.value = &value;
  in.options = &options;
  check_options(options, query.dtype);

  const char* names[] = {"query", "key", "value"};
  const TensorView* views[] = {&query, &key, &value};
  for (int t = 0; t < 3; ++t) {
    check_operand_dtype(*views[t], names[t], query.dtype, t > 0);
    if (views[t]->rank() < 2)
      fail(names[t], "expected rank >= 2 ((..., heads, seq, dim)), got shape " + shape_string(views[t]->shape));
    if (views[t]->rank() != query.rank())
      fail(names[t], "expected rank " + std::to_string(query.rank()) + " like the query, got shape " +
                         shape_string(views[t]->shape));
    check_view(*views[t], names[t]);
  }
  check_kv_scale(key, options.key_scale, "key", "options.key_scale");
  check_kv_scale(value, options.value_scale, "value", "options.value_scale");

  const Dims q = split(query), k = split(key), v = split(value);
  if (!k.same_batch(q))
    fail("key", "expected batch dims " + shape_string(q.batch()) + " like the query, got " + shape_string(k.batch()));
  if (!v.same_batch(q))
    fail("value", "expected batch dims " + shape_string(q.batch()) + " like the query, got " + shape_string(v.batch()));
  if (k.cols != q.cols)
    fail("key", "expected head dim E = " + std::to_string(q.cols) + " (the query's), got " + std::to_string(k.cols));
  if (q.cols < 1) fail("query", "expected head dim E >= 1, got shape " + shape_string(query.shape));
  if (v.rows != k.rows)
    fail("value",
         "expected sequence length S = " + std::to_string(k.rows) + " (the key's), got " + std::to_string(v.rows));
  if (v.heads != k.heads)
    fail("value", "expected " + std::to_string(k.heads) + " heads (the key's), got " + std::to_string(v.heads));
  if (k.heads < 1) fail("key", "expected at least one head, got shape " + shape_string(key.shape));
  if (q.heads % k.heads != 0)
    fail("key", "expected a head count dividing the query's " + std::to_string(q.heads) + " (GQA), got " +
                    std::to_string(k.heads));

  in.batch_shape = q.batch();
  in.heads_q = q.heads;
  in.heads_kv = k.heads;
  in.L = q.rows;
  in.S = k.rows;
  in.E = q.cols;
  in.Ev = v.cols;
  in.lse_shape.assign(query.shape.begin(), query.shape.end() - 1);  // (batch..., Hq, L)
  in.output_shape = query.shape;
  in.output_shape.back() = in.Ev;
  in.weights_shape = query.shape;
  in.weights_shape.back() = in.S;
  in.lse_dtype = query.dtype == DType::float64 ? DType::float64 : DType::float32;

  if (options.mask) {
    const TensorView& mask = *options.mask;
    if (mask.dtype == DType::int8)
      fail("mask", "expected bool, float16, bfloat16, float32 or float64, got int8", ErrorKind::type);
    check_view(mask, "mask");
    mask_broadcast_strides(mask, in.weights_shape);
  }
  check_per_head_options(options, in.batch_shape, in.heads_q, query.dtype);
  return in;
}

namespace {

// The spans of query, key, value, the mask and the per-head tensors.
std::vector<Span> input_spans_of(const CheckedInputs& in) {
  std::vector<Span> spans = per_head_spans(*in.options);
  spans.reserve(spans.size() + 4);
  for (const auto& [view, name] : {std::pair{in.query, "query"}, {in.key, "key"}, {in.value, "value"}})
    spans.push_back(check_view(*view, name));
  if (in.options->mask) spans.push_back(check_view(*in.options->mask, "mask"));
  return spans;
}

}  // namespace

Problem resolve_inputs(const CheckedInputs& in) {
  const TensorView& query = *in.query;
  const Options& options = *in.options;
  Problem p;
  p.batch = 1;
  for (std::int64_t size : in.batch_shape) p.batch *= size;
  p.heads_q = in.heads_q;
  p.heads_kv = in.heads_kv;
  p.L = in.L;
  p.S = in.S;
  p.E = in.E;
  p.Ev = in.Ev;
  p.query = make_operand(query, in.batch_shape, in.heads_q);
  p.key = make_operand(*in.key, in.batch_shape, in.heads_kv);
  p.value = make_operand(*in.value, in.batch_shape, in.heads_kv);
  // The scales: (batch..., Hkv, S), a column of stride 0 added so that row j is key j.
  if (options.key_scale) p.key_scale = lse_operand(*options.key_scale, in.batch_shape, in.heads_kv);
  if (options.value_scale) p.value_scale = lse_operand(*options.value_scale, in.batch_shape, in.heads_kv);
  if (options.mask) {
    p.mask = make_operand(*options.mask, in.batch_shape, in.heads_q,
                          mask_broadcast_strides(*options.mask, in.weights_shape));
    p.mask_is_bool = options.mask->dtype == DType::boolean;
  }
  resolve_options(options, query.dtype, p);
  return p;
}

void check_backward_reads(const BackwardInputs& tensors, const Shape& output_shape, const Shape& lse_shape, DType dtype,
                          DType lse_dtype, std::vector<Span>& input_spans) {
  std::vector<ExpectedView> reads{{&tensors.output, "output", &output_shape, dtype},
                                  {&tensors.lse, "lse", &lse_shape, lse_dtype},
                                  {&tensors.grad_output, "grad_output", &output_shape, dtype}};
  if (tensors.grad_lse) reads.push_back({&*tensors.grad_lse, "grad_lse", &lse_shape, lse_dtype});
  check_reads(reads, input_spans);
}

void expect_grad_sinks(const BackwardOutputs& outputs, const Options& options, std::vector<ExpectedView>& outs) {
  if (!outputs.grad_sinks) return;
  if (!options.sinks) fail("grad_sinks", "expected no buffer when there are no sinks, got one");
  outs.push_back({&*outputs.grad_sinks, "grad_sinks", &options.sinks->shape, options.sinks->dtype});
}

Problem make_problem(const CheckedInputs& in, const ForwardOutputs& outputs) {
  const TensorView& query = *in.query;
  std::vector<ExpectedView> outs{{&outputs.output, "output", &in.output_shape, query.dtype}};
  if (outputs.weights) outs.push_back({&*outputs.weights, "weights", &in.weights_shape, query.dtype});
  if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &in.lse_shape, in.lse_dtype});
  check_outputs(outs, input_spans_of(in));

  Problem p = resolve_inputs(in);
  p.output = make_operand(outputs.output, in.batch_shape, in.heads_q);
  if (outputs.weights) p.weights = make_operand(*outputs.weights, in.batch_shape, in.heads_q);
  if (outputs.lse) p.lse = lse_operand(*outputs.lse, in.batch_shape, in.heads_q);
  return p;
}

CheckedInputs check_backward_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                                    const Options& options) {
  check_not_quantized(key, value, kBackwardOfInt8);
  return check_inputs(query, key, value, options);
}

CheckedBackward make_backward_problem(const CheckedInputs& in, const BackwardInputs& tensors,
                                      const BackwardOutputs& outputs) {
  const TensorView& query = *in.query;
  const Options& options = *in.options;

  std::vector<Span> input_spans = input_spans_of(in);
  check_backward_reads(tensors, in.output_shape, in.lse_shape, query.dtype, in.lse_dtype, input_spans);

  std::vector<ExpectedView> outs{{&outputs.grad_query, "grad_query", &query.shape, query.dtype},
                                 {&outputs.grad_key, "grad_key", &in.key->shape, query.dtype},
                                 {&outputs.grad_value, "grad_value", &in.value->shape, query.dtype}};
  if (outputs.grad_mask) {
    if (!options.mask) fail("grad_mask", "expected no buffer when there is no mask, got one");
    if (options.mask->dtype == DType::boolean)
      fail("grad_mask", "expected no buffer for a bool mask (it has no gradient), got one");
    outs.push_back({&*outputs.grad_mask, "grad_mask", &options.mask->shape, options.mask->dtype});
  }
  expect_grad_sinks(outputs, options, outs);
  check_outputs(outs, input_spans);

  CheckedBackward checked;
  BackwardProblem& p = checked.problem;
  static_cast<Problem&>(p) = resolve_inputs(in);
  p.output = make_operand(tensors.output, in.batch_shape, in.heads_q);
  p.lse = lse_operand(tensors.lse, in.batch_shape, in.heads_q);
  if (tensors.grad_lse) p.grad_lse = lse_operand(*tensors.grad_lse, in.batch_shape, in.heads_q);
  p.grad_output = make_operand(tensors.grad_output, in.batch_shape, in.heads_q);
  p.grad_query = make_operand(outputs.grad_query, in.batch_shape, in.heads_q);
  p.grad_key = make_operand(outputs.grad_key, in.batch_shape, in.heads_kv);
  p.grad_value = make_operand(outputs.grad_value, in.batch_shape, in.heads_kv);
  if (outputs.grad_mask) {
    // Summed where the mask has size 1 (or no dim) and the scores have more.
    const Shape& mask_shape = outputs.grad_mask->shape;
    const Shape& target = in.weights_shape;
    for (std::size_t t = 0; t < target.size(); ++t) {
      const std::size_t missing = target.size() - mask_shape.size();
      const std::int64_t size = t < missing ? 1 : mask_shape[t - missing];
      if (size != target[t]) checked.mask_gradient_sums = true;
    }
    if (!checked.mask_gradient_sums)
      p.grad_mask = make_operand(*outputs.grad_mask, in.batch_shape, in.heads_q,
                                 mask_broadcast_strides(*outputs.grad_mask, target));
  }
  return checked;
}

}  // namespace sdpa::detail
