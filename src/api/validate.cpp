// Argument checking and resolution (DESIGN.md §1, "Bad input"). Every message reads
// "<argument>: expected <what>, got <what>", and nothing is written before all checks
// have passed.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

namespace sdpa::detail {

namespace {

using Shape = std::vector<std::int64_t>;

std::string to_string(const Shape& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

[[noreturn]] void fail(const std::string& argument, const std::string& message,
                       ErrorKind kind = ErrorKind::value) {
  throw Error(kind, argument, message);
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t product;
  if (__builtin_mul_overflow(a, b, &product))
    fail(argument, "expected sizes whose product fits in 64 bits, got an overflow");
  return product;
}
std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t sum;
  if (__builtin_add_overflow(a, b, &sum))
    fail(argument, "expected strides whose offsets fit in 64 bits, got an overflow");
  return sum;
}

// A byte range [begin, end) covering every element of a view; empty for no elements.
struct Span {
  std::uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
  bool overlaps(const Span& other) const {
    return !empty() && !other.empty() && begin < other.end && other.begin < end;
  }
};

// Checks a view on its own: strides match the rank, sizes are non-negative, the element
// count and every offset fit in 64 bits, data is non-null when there are elements.
// Returns the bytes it spans.
Span check_view(const TensorView& view, const std::string& name) {
  if (!view.strides.empty() && view.strides.size() != view.shape.size())
    fail(name, "expected " + std::to_string(view.shape.size()) + " strides (one per dim of shape " +
                   to_string(view.shape) + "), got " + std::to_string(view.strides.size()));
  std::int64_t count = 1;
  for (std::int64_t size : view.shape) {
    if (size < 0) fail(name, "expected non-negative sizes, got shape " + to_string(view.shape));
    count = checked_mul(count, size, name);
  }
  if (count == 0) return {};
  if (view.data == nullptr) fail(name, "expected data for " + std::to_string(count) + " elements, got a null pointer");
  const Shape strides = view.effective_strides();
  std::int64_t low = 0, high = 0;  // element offsets of the extreme elements
  for (std::size_t d = 0; d < view.shape.size(); ++d) {
    const std::int64_t reach = checked_mul(view.shape[d] - 1, strides[d], name);
    (reach < 0 ? low : high) = checked_add(reach < 0 ? low : high, reach, name);
  }
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(view.dtype));
  const std::int64_t low_bytes = checked_mul(low, element, name);
  const std::int64_t high_bytes = checked_add(checked_mul(high, element, name), element, name);
  const auto base = reinterpret_cast<std::uintptr_t>(view.data);
  return {base + static_cast<std::uintptr_t>(low_bytes), base + static_cast<std::uintptr_t>(high_bytes)};
}

// Outputs are written in parallel: no two elements may share memory. Sufficient test:
// ordered by |stride|, each stride steps past everything the smaller ones reach.
void check_no_self_overlap(const TensorView& view, const std::string& name) {
  if (view.numel() == 0) return;  // nothing is written (NumPy gives empty arrays zero strides)
  const Shape strides = view.effective_strides();
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (|stride|, size)
  for (std::size_t d = 0; d < view.shape.size(); ++d)
    if (view.shape[d] > 1) dims.emplace_back(std::abs(strides[d]), view.shape[d]);
  std::sort(dims.begin(), dims.end());
  std::int64_t reach = 1;  // elements covered by the dims so far
  for (auto [stride, size] : dims) {
    if (stride < reach)
      fail(name, "expected an output whose elements do not overlap, got strides " + to_string(strides) +
                     " for shape " + to_string(view.shape));
    reach = stride * (size - 1) + reach;
  }
}

bool is_float(DType dtype) { return dtype != DType::boolean; }

// Layout of one of query/key/value: (batch..., heads, rows, cols).
struct Dims {
  Shape batch;
  std::int64_t heads, rows, cols;
};
// Rank >= 4 is (batch..., heads, rows, cols); rank 3 is the seeds' (batch, rows, cols)
// with one head; rank 2 one matrix.
Dims split(const TensorView& t) {
  const std::size_t r = t.shape.size();
  const std::size_t matrix_dims = r >= 4 ? 3 : 2;
  Dims d;
  d.cols = t.shape[r - 1];
  d.rows = t.shape[r - 2];
  d.heads = r >= 4 ? t.shape[r - 3] : 1;
  d.batch.assign(t.shape.begin(), t.shape.end() - static_cast<std::ptrdiff_t>(matrix_dims));
  return d;
}

// The per-(batch, head) element offsets of a view whose dims are
// (batch_shape..., heads, rows, cols), given its (possibly broadcast, 0) strides.
Operand make_operand(const TensorView& view, const Shape& batch_shape, std::int64_t heads, const Shape& strides) {
  Operand op;
  op.data = static_cast<std::byte*>(view.data);
  op.dtype = view.dtype;
  op.element_size = dtype_size(view.dtype);
  const std::size_t nb = batch_shape.size();
  const std::size_t r = strides.size();
  op.row_stride = strides[r - 2];
  op.col_stride = strides[r - 1];
  const std::int64_t head_stride = r == nb + 3 ? strides[r - 3] : 0;  // no head dim: one head
  std::int64_t batch = 1;
  for (std::int64_t size : batch_shape) batch *= size;
  op.head_offset.resize(static_cast<std::size_t>(batch * heads));
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t base = 0, rest = b;
    for (std::size_t d = nb; d-- > 0;) {  // unravel b, row-major over the batch dims
      base += (rest % batch_shape[d]) * strides[d];
      rest /= batch_shape[d];
    }
    for (std::int64_t h = 0; h < heads; ++h)
      op.head_offset[static_cast<std::size_t>(b * heads + h)] = base + h * head_stride;
  }
  return op;
}

void check_options(const Options& options) {
  if (options.scale && !std::isfinite(*options.scale))
    fail("options.scale", "expected a finite number, got " + std::to_string(*options.scale));
  const double p = options.dropout_p;
  if (!(p >= 0.0 && p < 1.0))
    fail("options.dropout_p", "expected a probability in [0, 1), got " + std::to_string(p));
  if (options.num_threads < 0)
    fail("options.num_threads", "expected >= 0 (0 = default), got " + std::to_string(options.num_threads));
}

// Mask strides broadcast to `target` (= (batch..., Hq, L, S)): 0 where the mask has
// size 1 or lacks the dim (NumPy broadcasting, right-aligned).
Shape broadcast_mask_strides(const TensorView& mask, const Shape& target) {
  const std::size_t mr = mask.shape.size(), tr = target.size();
  if (mr > tr)
    fail("mask", "expected at most " + std::to_string(tr) + " dims, broadcastable to " + to_string(target) +
                     ", got shape " + to_string(mask.shape));
  const Shape mask_strides = mask.effective_strides();
  Shape strides(tr, 0);
  for (std::size_t d = 0; d < mr; ++d) {
    const std::size_t t = tr - mr + d;
    if (mask.shape[d] == target[t]) {
      strides[t] = target[t] == 1 ? 0 : mask_strides[d];
    } else if (mask.shape[d] != 1) {
      fail("mask", "expected a shape broadcastable to " + to_string(target) + ", got " + to_string(mask.shape) +
                       " (dim " + std::to_string(d) + ")");
    }
  }
  return strides;
}

}  // namespace

CheckedInputs check_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                           const Options& options) {
  CheckedInputs in;
  in.query = &query;
  in.key = &key;
  in.value = &value;
  in.options = &options;
  check_options(options);

  const char* names[] = {"query", "key", "value"};
  const TensorView* views[] = {&query, &key, &value};
  for (int t = 0; t < 3; ++t) {
    if (!is_float(views[t]->dtype))
      fail(names[t], std::string("expected float16, bfloat16, float32 or float64, got ") + dtype_name(views[t]->dtype),
           ErrorKind::type);
    if (views[t]->dtype != query.dtype)
      fail(names[t], std::string("expected the query's dtype ") + dtype_name(query.dtype) + ", got " +
                         dtype_name(views[t]->dtype), ErrorKind::type);
    if (views[t]->rank() < 2)
      fail(names[t], "expected rank >= 2 ((..., heads, seq, dim)), got shape " + to_string(views[t]->shape));
    if (views[t]->rank() != query.rank())
      fail(names[t], "expected rank " + std::to_string(query.rank()) + " like the query, got shape " +
                         to_string(views[t]->shape));
    check_view(*views[t], names[t]);
  }

  const Dims q = split(query), k = split(key), v = split(value);
  if (k.batch != q.batch)
    fail("key", "expected batch dims " + to_string(q.batch) + " like the query, got " + to_string(k.batch));
  if (v.batch != q.batch)
    fail("value", "expected batch dims " + to_string(q.batch) + " like the query, got " + to_string(v.batch));
  if (k.cols != q.cols)
    fail("key", "expected head dim E = " + std::to_string(q.cols) + " (the query's), got " + std::to_string(k.cols));
  if (q.cols < 1) fail("query", "expected head dim E >= 1, got shape " + to_string(query.shape));
  if (v.rows != k.rows)
    fail("value", "expected sequence length S = " + std::to_string(k.rows) + " (the key's), got " +
                      std::to_string(v.rows));
  if (v.heads != k.heads)
    fail("value", "expected " + std::to_string(k.heads) + " heads (the key's), got " + std::to_string(v.heads));
  if (k.heads < 1) fail("key", "expected at least one head, got shape " + to_string(key.shape));
  if (q.heads % k.heads != 0)
    fail("key", "expected a head count dividing the query's " + std::to_string(q.heads) + " (GQA), got " +
                    std::to_string(k.heads));

  in.batch_shape = q.batch;
  in.heads_q = q.heads;
  in.heads_kv = k.heads;
  in.L = q.rows;
  in.S = k.rows;
  in.E = q.cols;
  in.Ev = v.cols;
  Shape leading(query.shape.begin(), query.shape.end() - 1);  // (batch..., Hq, L)
  in.lse_shape = leading;
  in.output_shape = leading;
  in.output_shape.push_back(in.Ev);
  in.weights_shape = leading;
  in.weights_shape.push_back(in.S);
  in.lse_dtype = query.dtype == DType::float64 ? DType::float64 : DType::float32;

  if (options.mask) {
    const TensorView& mask = *options.mask;
    check_view(mask, "mask");
    broadcast_mask_strides(mask, in.weights_shape);
  }
  return in;
}

namespace {

// An output buffer to check: its view, name, and the shape and dtype it must have.
struct Output {
  const TensorView* view;
  const char* name;
  const Shape* shape;
  DType dtype;
};

// Checks each output's dtype, shape and strides, that no two of its elements share
// memory, and that it overlaps neither an input (`input_spans`) nor another output.
void check_outputs(const std::vector<Output>& outs, const std::vector<Span>& input_spans) {
  std::vector<Span> output_spans;
  for (const Output& o : outs) {
    if (o.view->dtype != o.dtype)
      fail(o.name, std::string("expected dtype ") + dtype_name(o.dtype) + ", got " + dtype_name(o.view->dtype),
           ErrorKind::type);
    if (o.view->shape != *o.shape)
      fail(o.name, "expected shape " + to_string(*o.shape) + ", got " + to_string(o.view->shape));
    const Span span = check_view(*o.view, o.name);
    check_no_self_overlap(*o.view, o.name);
    for (const Span& other : input_spans)
      if (span.overlaps(other)) fail(o.name, "expected a buffer apart from the inputs, got one that overlaps them");
    for (const Span& other : output_spans)
      if (span.overlaps(other)) fail(o.name, "expected a buffer apart from the other outputs, got an overlap");
    output_spans.push_back(span);
  }
}

// The spans of query, key, value and the mask.
std::vector<Span> input_spans_of(const CheckedInputs& in) {
  std::vector<Span> spans{check_view(*in.query, "query"), check_view(*in.key, "key"), check_view(*in.value, "value")};
  if (in.options->mask) spans.push_back(check_view(*in.options->mask, "mask"));
  return spans;
}

// The input side of a Problem: sizes, query/key/value/mask operands, the scalars.
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
  p.query = make_operand(query, in.batch_shape, in.heads_q, query.effective_strides());
  p.key = make_operand(*in.key, in.batch_shape, in.heads_kv, in.key->effective_strides());
  p.value = make_operand(*in.value, in.batch_shape, in.heads_kv, in.value->effective_strides());
  if (options.mask) {
    p.mask = make_operand(*options.mask, in.batch_shape, in.heads_q,
                          broadcast_mask_strides(*options.mask, in.weights_shape));
    p.mask_is_bool = options.mask->dtype == DType::boolean;
  }
  p.causal = options.causal;
  p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(in.E));
  p.dropout_p = options.dropout_p;
  p.seed = options.seed;
  p.offset = options.offset;
  p.num_threads = options.num_threads;
  p.float64 = query.dtype == DType::float64;
  return p;
}

// lse is (batch..., Hq, L): viewed as (batch..., Hq, L, 1) so that rows are queries.
Operand lse_operand(const TensorView& lse, const CheckedInputs& in) {
  Shape strides = lse.effective_strides();
  strides.push_back(0);
  return make_operand(lse, in.batch_shape, in.heads_q, strides);
}

}  // namespace

Problem make_problem(const CheckedInputs& in, const ForwardOutputs& outputs) {
  const TensorView& query = *in.query;
  std::vector<Output> outs{{&outputs.output, "output", &in.output_shape, query.dtype}};
  if (outputs.weights) outs.push_back({&*outputs.weights, "weights", &in.weights_shape, query.dtype});
  if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &in.lse_shape, in.lse_dtype});
  check_outputs(outs, input_spans_of(in));

  Problem p = resolve_inputs(in);
  p.output = make_operand(outputs.output, in.batch_shape, in.heads_q, outputs.output.effective_strides());
  if (outputs.weights)
    p.weights = make_operand(*outputs.weights, in.batch_shape, in.heads_q, outputs.weights->effective_strides());
  if (outputs.lse) p.lse = lse_operand(*outputs.lse, in);
  return p;
}

CheckedBackward make_backward_problem(const CheckedInputs& in, const BackwardInputs& tensors,
                                      const BackwardOutputs& outputs) {
  const TensorView& query = *in.query;
  const Options& options = *in.options;

  // The forward's results and dO: read-only, so any strides (an expanded dO of ones is
  // what autograd hands over for a sum), but the shapes and dtypes the forward gives.
  struct Read {
    const TensorView* view;
    const char* name;
    const Shape* shape;
    DType dtype;
  };
  const Read reads[] = {{&tensors.output, "output", &in.output_shape, query.dtype},
                        {&tensors.lse, "lse", &in.lse_shape, in.lse_dtype},
                        {&tensors.grad_output, "grad_output", &in.output_shape, query.dtype}};
  std::vector<Span> input_spans = input_spans_of(in);
  for (const Read& r : reads) {
    if (r.view->dtype != r.dtype)
      fail(r.name, std::string("expected dtype ") + dtype_name(r.dtype) + ", got " + dtype_name(r.view->dtype),
           ErrorKind::type);
    if (r.view->shape != *r.shape)
      fail(r.name, "expected shape " + to_string(*r.shape) + ", got " + to_string(r.view->shape));
    input_spans.push_back(check_view(*r.view, r.name));
  }

  std::vector<Output> outs{{&outputs.grad_query, "grad_query", &query.shape, query.dtype},
                           {&outputs.grad_key, "grad_key", &in.key->shape, query.dtype},
                           {&outputs.grad_value, "grad_value", &in.value->shape, query.dtype}};
  if (outputs.grad_mask) {
    if (!options.mask) fail("grad_mask", "expected no buffer when there is no mask, got one");
    if (options.mask->dtype == DType::boolean)
      fail("grad_mask", "expected no buffer for a bool mask (it has no gradient), got one");
    outs.push_back({&*outputs.grad_mask, "grad_mask", &options.mask->shape, options.mask->dtype});
  }
  check_outputs(outs, input_spans);

  CheckedBackward checked;
  BackwardProblem& p = checked.problem;
  static_cast<Problem&>(p) = resolve_inputs(in);
  p.output = make_operand(tensors.output, in.batch_shape, in.heads_q, tensors.output.effective_strides());
  p.lse = lse_operand(tensors.lse, in);
  p.grad_output =
      make_operand(tensors.grad_output, in.batch_shape, in.heads_q, tensors.grad_output.effective_strides());
  p.grad_query = make_operand(outputs.grad_query, in.batch_shape, in.heads_q, outputs.grad_query.effective_strides());
  p.grad_key = make_operand(outputs.grad_key, in.batch_shape, in.heads_kv, outputs.grad_key.effective_strides());
  p.grad_value = make_operand(outputs.grad_value, in.batch_shape, in.heads_kv, outputs.grad_value.effective_strides());
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
                                 broadcast_mask_strides(*outputs.grad_mask, target));
  }
  return checked;
}

Operand full_scores_operand(const TensorView& scores, const CheckedInputs& in) {
  return make_operand(scores, in.batch_shape, in.heads_q, scores.effective_strides());
}

std::vector<std::int64_t> mask_broadcast_strides(const TensorView& mask, const std::vector<std::int64_t>& target) {
  return broadcast_mask_strides(mask, target);
}

}  // namespace sdpa::detail
