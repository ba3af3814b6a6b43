#include "api/paged.h"

#include <string>

#include "api/resolve_options.h"
#include "api/validate.h"

namespace sdpa::detail {

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
  // int8 pages: their scales are pages too, (pages, Hkv, page_size), in the options.
  check_kv_scale(kp, options.key_scale, "key_pages", "options.key_scale");
  check_kv_scale(vp, options.value_scale, "value_pages", "options.value_scale");
  const PagedSizes n{query.shape[0], query.shape[1], kp.shape[1], query.shape[2],
                     query.shape[3], vp.shape[3],    kp.shape[0], kp.shape[2]};
  if (kp.shape[3] != n.E)
    fail("key_pages",
         "expected head dim E = " + std::to_string(n.E) + " (the query's), got " + std::to_string(kp.shape[3]));
  if (n.E < 1) fail("query", "expected head dim E >= 1, got shape " + shape_string(query.shape));
  if (vp.shape[0] != n.pages || vp.shape[1] != n.heads_kv || vp.shape[2] != n.page_rows)
    fail("value_pages", "expected (" + std::to_string(n.pages) + ", " + std::to_string(n.heads_kv) + ", " +
                            std::to_string(n.page_rows) + ", Ev) like key_pages, got shape " + shape_string(vp.shape));
  check_heads(n.heads_q, n.heads_kv, "key_pages");
  if (n.page_rows < 1) fail("key_pages", "expected a page size >= 1, got shape " + shape_string(kp.shape));

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
  check_per_head_options(options, {n.batch}, n.heads_q, query.dtype);
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
    op.page_offset.push_back(cache.block_table[static_cast<std::size_t>(b * cache.blocks_per_sequence + k)] *
                             strides[0]);
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

// The same for the scale pages (pages, Hkv, page_size) of int8 pages: (1, Hkv, S).
TensorView stand_in_scales(const TensorView& scale_pages, std::int64_t S) {
  const Shape strides = scale_pages.effective_strides();
  TensorView view = scale_pages;
  view.shape = {1, scale_pages.shape[1], S};
  view.strides = {0, strides[1], 0};
  return view;
}

// Sequence b's scales as an Operand reading through its block table: the scale pages
// with a column dim of stride 0 added, so that row j is key j.
Operand paged_scale_operand(const TensorView& scale_pages, const PagedKV& cache, std::int64_t b, std::int64_t S) {
  TensorView columns = scale_pages;
  columns.strides = scale_pages.effective_strides();
  columns.shape.push_back(1);
  columns.strides.push_back(0);
  return paged_operand(columns, cache, b, S);
}

}  // namespace

OutputShapes check_paged_inputs(const TensorView& query, const PagedKV& cache, const Options& options) {
  const PagedSizes n = check_paged_operands(query, cache, options);
  return {{n.batch, n.heads_q, n.L, n.Ev},
          {n.batch, n.heads_q, n.L},
          query.dtype,
          query.dtype == DType::float64 ? DType::float64 : DType::float32};
}

std::vector<Problem> make_paged_problems(const TensorView& query, const PagedKV& cache, const ForwardOutputs& outputs,
                                         const Options& options) {
  const OutputShapes shapes = check_paged_inputs(query, cache, options);
  check_no_weights(outputs.weights.has_value());
  std::vector<ExpectedView> outs{{&outputs.output, "output", &shapes.output_shape, shapes.output_dtype}};
  if (outputs.lse) outs.push_back({&*outputs.lse, "lse", &shapes.lse_shape, shapes.lse_dtype});
  std::vector<Span> input_spans = per_head_spans(options);
  for (const auto& [view, name] :
       {std::pair{&query, "query"}, {&cache.key_pages, "key_pages"}, {&cache.value_pages, "value_pages"}})
    input_spans.push_back(check_view(*view, name));
  check_outputs(outs, input_spans);

  std::vector<Problem> problems;
  for (std::int64_t b = 0; b < query.shape[0]; ++b) {
    const std::int64_t S = cache.seq_lens[static_cast<std::size_t>(b)];
    const TensorView q = batch_element(query, b);
    const TensorView k = stand_in_keys(cache.key_pages, S), v = stand_in_keys(cache.value_pages, S);
    ForwardOutputs slices{batch_element(outputs.output, b), std::nullopt, std::nullopt};
    if (outputs.lse) slices.lse = batch_element(*outputs.lse, b);
    Options sequence = sequence_options(options, b);
    if (options.key_scale) sequence.key_scale = stand_in_scales(*options.key_scale, S);
    if (options.value_scale) sequence.value_scale = stand_in_scales(*options.value_scale, S);
    Problem p = make_problem(check_inputs(q, k, v, sequence), slices);
    p.key = paged_operand(cache.key_pages, cache, b, S);
    p.value = paged_operand(cache.value_pages, cache, b, S);
    if (options.key_scale) p.key_scale = paged_scale_operand(*options.key_scale, cache, b, S);
    if (options.value_scale) p.value_scale = paged_scale_operand(*options.value_scale, cache, b, S);
    p.first_batch = b;
    problems.push_back(std::move(p));
  }
  return problems;
}

}  // namespace sdpa::detail
