#include "api/sequences.h"

#include <string>

#include "api/validate.h"
#include "api/views.h"

namespace sdpa::detail {

void check_no_weights(bool requested) {
  if (requested) fail("weights", "expected no weights for a packed or paged call (they are ragged), got a request");
}

void check_no_mask(const Options& options) {
  if (options.mask)
    fail("mask", "expected no mask for a packed or paged call (use causal, the window or ALiBi), got one");
}

void check_float_operands(const std::vector<std::pair<const TensorView*, const char*>>& operands, std::size_t rank,
                          const char* layout) {
  const DType dtype = operands.front().first->dtype;
  for (const auto& [view, name] : operands) {
    check_operand_dtype(*view, name, dtype, view != operands.front().first);  // keys and values follow the query
    if (view->rank() != rank)
      fail(name, std::string("expected ") + layout + ", got shape " + shape_string(view->shape));
    check_view(*view, name);
  }
}

void check_heads(std::int64_t heads_q, std::int64_t heads_kv, const char* key_name) {
  if (heads_kv < 1) fail(key_name, "expected at least one head, got " + std::to_string(heads_kv));
  if (heads_q % heads_kv != 0)
    fail(key_name, "expected a head count dividing the query's " + std::to_string(heads_q) + " (GQA), got " +
                       std::to_string(heads_kv));
}

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

TensorView batch_element(const TensorView& view, std::int64_t b) {
  const Shape strides = view.effective_strides();
  TensorView element = view;
  element.strides = strides;
  element.shape[0] = 1;
  element.strides[0] = 0;
  if (view.numel() != 0)
    element.data =
        static_cast<std::byte*>(view.data) + b * strides[0] * static_cast<std::int64_t>(dtype_size(view.dtype));
  return element;
}

namespace {

// Row b of a per-head tensor (batch, Hq) as (Hq,); a (Hq,) tensor as it is.
TensorView sequence_row(const TensorView& per_head, std::int64_t b) {
  if (per_head.rank() != 2) return per_head;
  TensorView row = batch_element(per_head, b);
  row.shape.erase(row.shape.begin());
  row.strides.erase(row.strides.begin());
  return row;
}

}  // namespace

Options sequence_options(const Options& options, std::int64_t b) {
  Options sequence = options;
  if (options.alibi_slopes) sequence.alibi_slopes = sequence_row(*options.alibi_slopes, b);
  if (options.sinks) sequence.sinks = sequence_row(*options.sinks, b);
  return sequence;
}

}  // namespace sdpa::detail
