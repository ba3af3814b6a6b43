// Argument checking and resolution (DESIGN.md §1, "Bad input"). Every message reads
// "<argument>: expected <what>, got <what>", and nothing is written before all checks
// have passed.
#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
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

// A double as a person would write it (1e+39, 0.125), not std::to_string's 39 digits.
std::string to_string(double value) {
  std::ostringstream out;
  out << value;
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

// `query_dtype` sets the compute dtype: float64 for float64, float32 for the others.
void check_options(const Options& options, DType query_dtype) {
  if (options.scale && !std::isfinite(*options.scale))
    fail("options.scale", "expected a finite number, got " + std::to_string(*options.scale));
  // A scale or cap finite in double but not in float32 (1e39) would make every float32
  // score infinite and every output NaN: refused, naming the compute dtype. The float32
  // kernels fold log2(e) into both (exp2 instead of exp), so the bound is float32's
  // largest value over log2(e).
  const auto check_fits_float32 = [&](const char* name, double value) {
    const double largest = std::numeric_limits<float>::max() / std::numbers::log2e;
    if (query_dtype != DType::float64 && std::abs(value) > largest)
      fail(name, "expected a number finite in float32, the compute dtype of " + std::string(dtype_name(query_dtype)) +
                     " inputs (|x| <= " + to_string(largest) + ", float32's largest over log2(e)), got " +
                     to_string(value));
  };
  if (options.scale) check_fits_float32("options.scale", *options.scale);
  check_fits_float32("options.softcap", options.softcap);
  const double p = options.dropout_p;
  if (!(p >= 0.0 && p < 1.0))
    fail("options.dropout_p", "expected a probability in [0, 1), got " + std::to_string(p));
  if (options.num_threads < 0 || options.num_threads > Options::kMaxThreads)
    fail("options.num_threads", "expected an integer in [0, " + std::to_string(Options::kMaxThreads) +
                                    "] (0 = default), got " + std::to_string(options.num_threads));
  if (options.window_left < -1)
    fail("options.window_left", "expected >= 0, or -1 for unbounded, got " + std::to_string(options.window_left));
  if (options.window_right < -1)
    fail("options.window_right", "expected >= 0, or -1 for unbounded, got " + std::to_string(options.window_right));
  if (!(std::isfinite(options.softcap) && options.softcap >= 0.0))
    fail("options.softcap", "expected a finite cap > 0, or 0 for none, got " + std::to_string(options.softcap));
  if (options.alignment && options.causal != Causal::none) {
    const bool causal_bottom_right = options.causal == Causal::bottom_right;
    if ((*options.alignment == Alignment::bottom_right) != causal_bottom_right)
      fail("options.alignment", std::string("expected the causal alignment (") +
                                    (causal_bottom_right ? "bottom_right" : "top_left") + "), got " +
                                    (causal_bottom_right ? "top_left" : "bottom_right"));
  }
}

// ALiBi slopes: float32 or float64, shape (Hq,) or (batch..., Hq).
void check_alibi_slopes(const TensorView& slopes, const Shape& batch_shape, std::int64_t heads_q) {
  if (slopes.dtype != DType::float32 && slopes.dtype != DType::float64)
    fail("alibi_slopes", std::string("expected float32 or float64, got ") + dtype_name(slopes.dtype), ErrorKind::type);
  Shape full = batch_shape;
  full.push_back(heads_q);
  if (slopes.shape != Shape{heads_q} && slopes.shape != full)
    fail("alibi_slopes", "expected shape (" + std::to_string(heads_q) + ",) or " + to_string(full) + ", got " +
                             to_string(slopes.shape));
  check_view(slopes, "alibi_slopes");
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
  check_options(options, query.dtype);

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
  if (options.alibi_slopes) check_alibi_slopes(*options.alibi_slopes, in.batch_shape, in.heads_q);
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

// A backward's read-only tensors besides Q, K, V: the forward's output and lse, dO, and
// dlse when given.
// Any strides (an expanded dO of ones is what autograd hands over for a sum), but the
// shapes and dtypes the forward gives. Adds their spans to `input_spans`.
void check_backward_reads(const BackwardInputs& tensors, const Shape& output_shape, const Shape& lse_shape,
                          DType dtype, DType lse_dtype, std::vector<Span>& input_spans) {
  struct Read {
    const TensorView* view;
    const char* name;
    const Shape* shape;
    DType dtype;
  };
  const Read reads[] = {{&tensors.output, "output", &output_shape, dtype},
                        {&tensors.lse, "lse", &lse_shape, lse_dtype},
                        {&tensors.grad_output, "grad_output", &output_shape, dtype}};
  std::vector<Read> all(std::begin(reads), std::end(reads));
  if (tensors.grad_lse) all.push_back({&*tensors.grad_lse, "grad_lse", &lse_shape, lse_dtype});
  for (const Read& r : all) {
    if (r.view->dtype != r.dtype)
      fail(r.name, std::string("expected dtype ") + dtype_name(r.dtype) + ", got " + dtype_name(r.view->dtype),
           ErrorKind::type);
    if (r.view->shape != *r.shape)
      fail(r.name, "expected shape " + to_string(*r.shape) + ", got " + to_string(r.view->shape));
    input_spans.push_back(check_view(*r.view, r.name));
  }
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
  // Causal is the window's right edge at the diagonal, with the causal alignment.
  const bool bottom_right = options.causal != Causal::none
                                ? options.causal == Causal::bottom_right
                                : options.alignment.value_or(Alignment::bottom_right) == Alignment::bottom_right;
  p.diagonal_shift = bottom_right ? in.S - in.L : 0;
  // A side wider than L + S reaches every key: clamped so that i + shift ± side cannot overflow.
  p.window_left = std::min(options.window_left, in.L + in.S);
  p.window_right = std::min(options.window_right, in.L + in.S);
  if (options.causal != Causal::none) p.window_right = p.window_right < 0 ? 0 : std::min<std::int64_t>(p.window_right, 0);
  p.softcap = options.softcap;
  if (options.alibi_slopes) {
    // One slope per query matrix (batch · Hq), whichever of the two shapes was given.
    const TensorView& slopes = *options.alibi_slopes;
    const Shape strides = slopes.effective_strides();
    const bool per_batch = slopes.rank() > 1;
    p.alibi_slopes.resize(static_cast<std::size_t>(p.batch * p.heads_q));
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        std::int64_t offset = h * strides.back(), rest = b;
        for (std::size_t d = slopes.rank() - 1; per_batch && d-- > 0;) {  // unravel b over the batch dims
          offset += (rest % slopes.shape[d]) * strides[d];
          rest /= slopes.shape[d];
        }
        p.alibi_slopes[static_cast<std::size_t>(b * p.heads_q + h)] = load_element<double>(
            static_cast<const std::byte*>(slopes.data) + offset * static_cast<std::int64_t>(dtype_size(slopes.dtype)),
            slopes.dtype);
      }
  }
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

  std::vector<Span> input_spans = input_spans_of(in);
  check_backward_reads(tensors, in.output_shape, in.lse_shape, query.dtype, in.lse_dtype, input_spans);

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
  if (tensors.grad_lse) p.grad_lse = lse_operand(*tensors.grad_lse, in);
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

// ---- Packed variable-length batches and the paged KV cache -------------------------

void check_no_weights(bool requested) {
  if (requested) fail("weights", "expected no weights for a packed or paged call (they are ragged), got a request");
}

namespace {

// What varlen and paged calls do not take: a mask (per-sequence masks have no packed
// form).
void check_no_mask(const Options& options) {
  if (options.mask)
    fail("mask", "expected no mask for a packed or paged call (use causal, the window or ALiBi), got one");
}

// Query, key and value (or pages) share a float dtype and have `rank` dims.
void check_float_operands(const std::vector<std::pair<const TensorView*, const char*>>& operands, std::size_t rank,
                          const char* layout) {
  const DType dtype = operands.front().first->dtype;
  for (const auto& [view, name] : operands) {
    if (!is_float(view->dtype))
      fail(name, std::string("expected float16, bfloat16, float32 or float64, got ") + dtype_name(view->dtype),
           ErrorKind::type);
    if (view->dtype != dtype)
      fail(name, std::string("expected the query's dtype ") + dtype_name(dtype) + ", got " + dtype_name(view->dtype),
           ErrorKind::type);
    if (view->rank() != rank) fail(name, std::string("expected ") + layout + ", got shape " + to_string(view->shape));
    check_view(*view, name);
  }
}

void check_heads(std::int64_t heads_q, std::int64_t heads_kv) {
  if (heads_kv < 1) fail("key", "expected at least one head, got " + std::to_string(heads_kv));
  if (heads_q % heads_kv != 0)
    fail("key", "expected a head count dividing the query's " + std::to_string(heads_q) + " (GQA), got " +
                    std::to_string(heads_kv));
}

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

// Rows [row0, row0 + rows) of a (heads, total, cols) packed view as a (1, heads, rows,
// cols) view: one sequence, as forward() takes it.
TensorView sequence_view(const TensorView& packed, std::int64_t row0, std::int64_t rows) {
  const Shape strides = packed.effective_strides();
  TensorView view;
  view.dtype = packed.dtype;
  view.data = packed.numel() == 0 ? packed.data
                                  : static_cast<std::byte*>(packed.data) +
                                        row0 * strides[1] * static_cast<std::int64_t>(dtype_size(packed.dtype));
  view.shape = {1, packed.shape[0], rows};
  view.strides = {0, strides[0], strides[1]};
  for (std::size_t d = 2; d < packed.shape.size(); ++d) {  // the column dim, if any (lse has none)
    view.shape.push_back(packed.shape[d]);
    view.strides.push_back(strides[d]);
  }
  return view;
}

// Element b of a (batch, ...) view with the batch dim kept at size 1.
TensorView batch_element(const TensorView& view, std::int64_t b) {
  const Shape strides = view.effective_strides();
  TensorView element = view;
  element.strides = strides;
  element.shape[0] = 1;
  element.strides[0] = 0;
  if (view.numel() != 0)
    element.data = static_cast<std::byte*>(view.data) + b * strides[0] * static_cast<std::int64_t>(dtype_size(view.dtype));
  return element;
}

// Options of sequence b: per-batch ALiBi slopes (batch, Hq) become its row (Hq,).
Options sequence_options(const Options& options, std::int64_t b) {
  Options sequence = options;
  if (options.alibi_slopes && options.alibi_slopes->rank() == 2) {
    TensorView row = batch_element(*options.alibi_slopes, b);
    row.shape.erase(row.shape.begin());
    row.strides.erase(row.strides.begin());
    sequence.alibi_slopes = row;
  }
  return sequence;
}

struct PackedSizes {
  std::int64_t heads_q, heads_kv, total_q, total_k, E, Ev, batch;
};

PackedSizes check_varlen_operands(const TensorView& query, const TensorView& key, const TensorView& value,
                                  const VarlenSequences& sequences, const Options& options) {
  check_options(options, query.dtype);
  check_no_mask(options);
  check_float_operands({{&query, "query"}, {&key, "key"}, {&value, "value"}}, 3, "rank 3 (heads, total, dim)");
  const PackedSizes n{query.shape[0], key.shape[0], query.shape[1], key.shape[1], query.shape[2], value.shape[2],
                      static_cast<std::int64_t>(sequences.cu_seqlens_q.size()) - 1};
  if (key.shape[2] != n.E)
    fail("key", "expected head dim E = " + std::to_string(n.E) + " (the query's), got " + std::to_string(key.shape[2]));
  if (n.E < 1) fail("query", "expected head dim E >= 1, got shape " + to_string(query.shape));
  if (value.shape[0] != n.heads_kv || value.shape[1] != n.total_k)
    fail("value", "expected (" + std::to_string(n.heads_kv) + ", " + std::to_string(n.total_k) +
                      ", Ev) like the key, got shape " + to_string(value.shape));
  check_heads(n.heads_q, n.heads_kv);
  check_cu_seqlens(sequences.cu_seqlens_q, n.total_q, "cu_seqlens_q");
  check_cu_seqlens(sequences.cu_seqlens_k, n.total_k, "cu_seqlens_k");
  if (sequences.cu_seqlens_k.size() != sequences.cu_seqlens_q.size())
    fail("cu_seqlens_k", "expected " + std::to_string(sequences.cu_seqlens_q.size()) +
                             " entries (the batch of cu_seqlens_q), got " +
                             std::to_string(sequences.cu_seqlens_k.size()));
  if (options.alibi_slopes) check_alibi_slopes(*options.alibi_slopes, {n.batch}, n.heads_q);
  return n;
}

}  // namespace

OutputShapes check_varlen_inputs(const TensorView& query, const TensorView& key, const TensorView& value,
                                 const VarlenSequences& sequences, const Options& options) {
  const PackedSizes n = check_varlen_operands(query, key, value, sequences, options);
  return {{n.heads_q, n.total_q, n.Ev}, {n.heads_q, n.total_q}, query.dtype,
          query.dtype == DType::float64 ? DType::float64 : DType::float32};
}

std::vector<Problem> make_varlen_problems(const TensorView& query, const TensorView& key, const TensorView& value,
                                          const VarlenSequences& sequences, const ForwardOutputs& outputs,
                                          const Options& options) {
  const OutputShapes shapes = check_varlen_inputs(query, key, value, sequences, options);
  check_no_weights(outputs.weights.has_value());
  std::vector<Output> outs{{&outputs.output, "output", &shapes.output_shape, shapes.output_dtype}};
  if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &shapes.lse_shape, shapes.lse_dtype});
  std::vector<Span> input_spans{check_view(query, "query"), check_view(key, "key"), check_view(value, "value")};
  if (options.alibi_slopes) input_spans.push_back(check_view(*options.alibi_slopes, "alibi_slopes"));
  check_outputs(outs, input_spans);

  const std::vector<std::int64_t>& cu_q = sequences.cu_seqlens_q;
  const std::vector<std::int64_t>& cu_k = sequences.cu_seqlens_k;
  std::vector<Problem> problems;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const TensorView q = sequence_view(query, cu_q[b], cu_q[b + 1] - cu_q[b]);
    const TensorView k = sequence_view(key, cu_k[b], cu_k[b + 1] - cu_k[b]);
    const TensorView v = sequence_view(value, cu_k[b], cu_k[b + 1] - cu_k[b]);
    const Options sequence = sequence_options(options, static_cast<std::int64_t>(b));
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
  const OutputShapes shapes = check_varlen_inputs(inputs.query, inputs.key, inputs.value, sequences, options);
  if (outputs.grad_mask) fail("grad_mask", "expected no buffer for a packed call (it takes no mask), got one");
  // The whole call first: shapes, dtypes, no output overlapping an input or another output.
  std::vector<Span> input_spans{check_view(inputs.query, "query"), check_view(inputs.key, "key"),
                                check_view(inputs.value, "value")};
  if (options.alibi_slopes) input_spans.push_back(check_view(*options.alibi_slopes, "alibi_slopes"));
  check_backward_reads(inputs, shapes.output_shape, shapes.lse_shape, shapes.output_dtype, shapes.lse_dtype,
                       input_spans);
  const DType dtype = inputs.query.dtype;
  check_outputs({{&outputs.grad_query, "grad_query", &inputs.query.shape, dtype},
                 {&outputs.grad_key, "grad_key", &inputs.key.shape, dtype},
                 {&outputs.grad_value, "grad_value", &inputs.value.shape, dtype}},
                input_spans);

  const std::vector<std::int64_t>& cu_q = sequences.cu_seqlens_q;
  const std::vector<std::int64_t>& cu_k = sequences.cu_seqlens_k;
  std::vector<SequenceBackward> calls;
  for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const std::int64_t q0 = cu_q[b], L = cu_q[b + 1] - q0, k0 = cu_k[b], S = cu_k[b + 1] - k0;
    BackwardInputs sequence{sequence_view(inputs.query, q0, L),  sequence_view(inputs.key, k0, S),
                            sequence_view(inputs.value, k0, S),  sequence_view(inputs.output, q0, L),
                            sequence_view(inputs.lse, q0, L),    sequence_view(inputs.grad_output, q0, L)};
    if (inputs.grad_lse) sequence.grad_lse = sequence_view(*inputs.grad_lse, q0, L);
    BackwardOutputs gradients{sequence_view(outputs.grad_query, q0, L), sequence_view(outputs.grad_key, k0, S),
                              sequence_view(outputs.grad_value, k0, S), std::nullopt};
    const Options sequence_opts = sequence_options(options, static_cast<std::int64_t>(b));
    const CheckedInputs checked = check_inputs(sequence.query, sequence.key, sequence.value, sequence_opts);
    SequenceBackward call{make_backward_problem(checked, sequence, gradients).problem, gradients};
    call.problem.first_batch = static_cast<std::int64_t>(b);
    calls.push_back(std::move(call));
  }
  return calls;
}

namespace {

struct PagedSizes {
  std::int64_t batch, heads_q, heads_kv, L, E, Ev, pages, page_rows;
};

PagedSizes check_paged_operands(const TensorView& query, const PagedKV& cache, const Options& options) {
  check_options(options, query.dtype);
  check_no_mask(options);
  check_float_operands({{&query, "query"}, {&cache.key_pages, "key_pages"}, {&cache.value_pages, "value_pages"}}, 4,
                       "rank 4 ((batch, heads, seq, dim) for the query, (pages, heads, page_size, dim) for pages)");
  const TensorView& kp = cache.key_pages;
  const TensorView& vp = cache.value_pages;
  const PagedSizes n{query.shape[0], query.shape[1], kp.shape[1], query.shape[2],
                     query.shape[3], vp.shape[3],    kp.shape[0], kp.shape[2]};
  if (kp.shape[3] != n.E)
    fail("key_pages", "expected head dim E = " + std::to_string(n.E) + " (the query's), got " + std::to_string(kp.shape[3]));
  if (n.E < 1) fail("query", "expected head dim E >= 1, got shape " + to_string(query.shape));
  if (vp.shape[0] != n.pages || vp.shape[1] != n.heads_kv || vp.shape[2] != n.page_rows)
    fail("value_pages", "expected (" + std::to_string(n.pages) + ", " + std::to_string(n.heads_kv) + ", " +
                            std::to_string(n.page_rows) + ", Ev) like key_pages, got shape " + to_string(vp.shape));
  if (n.heads_kv < 1) fail("key_pages", "expected at least one head, got shape " + to_string(kp.shape));
  if (n.heads_q % n.heads_kv != 0)
    fail("key_pages", "expected a head count dividing the query's " + std::to_string(n.heads_q) + " (GQA), got " +
                          std::to_string(n.heads_kv));
  if (n.page_rows < 1) fail("key_pages", "expected a page size >= 1, got shape " + to_string(kp.shape));

  const std::int64_t blocks = cache.blocks_per_sequence;
  if (blocks < 0) fail("blocks_per_sequence", "expected >= 0, got " + std::to_string(blocks));
  if (static_cast<std::int64_t>(cache.seq_lens.size()) != n.batch)
    fail("seq_lens", "expected " + std::to_string(n.batch) + " entries (the query's batch), got " +
                         std::to_string(cache.seq_lens.size()));
  if (static_cast<std::int64_t>(cache.block_table.size()) != checked_mul(n.batch, blocks, "block_table"))
    fail("block_table", "expected batch × blocks_per_sequence = " + std::to_string(n.batch) + " × " +
                            std::to_string(blocks) + " entries, got " + std::to_string(cache.block_table.size()));
  const std::int64_t capacity = checked_mul(blocks, n.page_rows, "blocks_per_sequence");
  for (std::int64_t b = 0; b < n.batch; ++b) {
    const std::int64_t S = cache.seq_lens[static_cast<std::size_t>(b)];
    if (S < 0 || S > capacity)
      fail("seq_lens", "expected lengths in [0, blocks_per_sequence × page_size = " + std::to_string(capacity) +
                           "], got " + std::to_string(S) + " for sequence " + std::to_string(b));
    for (std::int64_t k = 0; k < (S + n.page_rows - 1) / n.page_rows; ++k) {
      const std::int64_t page = cache.block_table[static_cast<std::size_t>(b * blocks + k)];
      if (page < 0 || page >= n.pages)
        fail("block_table", "expected page indices in [0, " + std::to_string(n.pages) + "), got " +
                                std::to_string(page) + " at (" + std::to_string(b) + ", " + std::to_string(k) + ")");
    }
  }
  if (options.alibi_slopes) check_alibi_slopes(*options.alibi_slopes, {n.batch}, n.heads_q);
  return n;
}

// Sequence b's keys as an Operand reading through its block table.
Operand paged_operand(const TensorView& pages, const PagedKV& cache, std::int64_t b, std::int64_t S) {
  const Shape strides = pages.effective_strides();
  Operand op;
  op.data = static_cast<std::byte*>(pages.data);
  op.dtype = pages.dtype;
  op.element_size = dtype_size(pages.dtype);
  op.row_stride = strides[2];
  op.col_stride = strides[3];
  op.page_rows = pages.shape[2];
  for (std::int64_t h = 0; h < pages.shape[1]; ++h) op.head_offset.push_back(h * strides[1]);
  for (std::int64_t k = 0; k < (S + op.page_rows - 1) / op.page_rows; ++k)
    op.page_offset.push_back(cache.block_table[static_cast<std::size_t>(b * cache.blocks_per_sequence + k)] * strides[0]);
  return op;
}

// A stand-in for sequence b's keys that check_inputs can read the sizes of: S rows, all
// at the first page's row 0 (inside the pages, so overlap checks stay meaningful).
TensorView stand_in_keys(const TensorView& pages, std::int64_t S) {
  const Shape strides = pages.effective_strides();
  TensorView view = pages;
  view.shape = {1, pages.shape[1], S, pages.shape[3]};
  view.strides = {0, strides[1], 0, strides[3]};
  return view;
}

}  // namespace

OutputShapes check_paged_inputs(const TensorView& query, const PagedKV& cache, const Options& options) {
  const PagedSizes n = check_paged_operands(query, cache, options);
  return {{n.batch, n.heads_q, n.L, n.Ev}, {n.batch, n.heads_q, n.L}, query.dtype,
          query.dtype == DType::float64 ? DType::float64 : DType::float32};
}

std::vector<Problem> make_paged_problems(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                                         const Options& options) {
  const OutputShapes shapes = check_paged_inputs(query, cache, options);
  check_no_weights(outputs.weights.has_value());
  std::vector<Output> outs{{&outputs.output, "output", &shapes.output_shape, shapes.output_dtype}};
  if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &shapes.lse_shape, shapes.lse_dtype});
  std::vector<Span> input_spans{check_view(query, "query"), check_view(cache.key_pages, "key_pages"),
                                check_view(cache.value_pages, "value_pages")};
  if (options.alibi_slopes) input_spans.push_back(check_view(*options.alibi_slopes, "alibi_slopes"));
  check_outputs(outs, input_spans);

  std::vector<Problem> problems;
  for (std::int64_t b = 0; b < query.shape[0]; ++b) {
    const std::int64_t S = cache.seq_lens[static_cast<std::size_t>(b)];
    const TensorView q = batch_element(query, b);
    const TensorView k = stand_in_keys(cache.key_pages, S), v = stand_in_keys(cache.value_pages, S);
    ForwardOutputs slices{batch_element(outputs.output, b), std::nullopt, std::nullopt};
    if (outputs.lse) slices.lse = batch_element(*outputs.lse, b);
    Problem p = make_problem(check_inputs(q, k, v, sequence_options(options, b)), slices);
    p.key = paged_operand(cache.key_pages, cache, b, S);
    p.value = paged_operand(cache.value_pages, cache, b, S);
    p.first_batch = b;
    problems.push_back(std::move(p));
  }
  return problems;
}

}  // namespace sdpa::detail
