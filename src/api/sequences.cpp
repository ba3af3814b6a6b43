#include "api/sequences.h"

#include <string>

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

void check_heads(std::int64_t heads_q, std::int64_t heads_kv, const char* key_name) {
  if (heads_kv < 1) fail(key_name, "expected at least one head, got " + std::to_string(heads_kv));
  if (heads_q % heads_kv != 0)
    fail(key_name, "expected a head count dividing the query's " + std::to_string(heads_q) + " (GQA), got " +
                    std::to_string(heads_kv));
}

}  // namespace sdpa::detail
