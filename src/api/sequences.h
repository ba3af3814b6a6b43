// What packed variable-length (varlen.h) and paged (paged.h) calls share: each is run
// as one Problem per sequence (Problem::first_batch = its index), built by checking the
// whole call first, so that nothing is written on error, then each sequence's views
// through the dense checks (validate.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "sdpa/options.h"
#include "sdpa/tensor.h"

namespace sdpa::detail {

// The shapes of a varlen or paged call's outputs, once its inputs are checked.
struct OutputShapes {
  std::vector<std::int64_t> output_shape, lse_shape;
  DType output_dtype = DType::float32, lse_dtype = DType::float32;
};

// Varlen and paged calls return no weights (they would be ragged): an error naming
// `weights` when they are asked for, as a buffer or as an allocating call's Returns.
void check_no_weights(bool requested);

// Nor do they take a mask (per-sequence masks have no packed form).
void check_no_mask(const Options& options);

// Query, key and value (or pages) share a float dtype, or key and value are int8
// (quantized, their scales checked by check_kv_scale), and have `rank` dims (`layout`
// says which, for the message).
void check_float_operands(const std::vector<std::pair<const TensorView*, const char*>>& operands, std::size_t rank,
                          const char* layout);

// Hkv >= 1 dividing Hq (GQA); errors name `key_name`.
void check_heads(std::int64_t heads_q, std::int64_t heads_kv, const char* key_name);

// Rows [row0, row0 + rows) of a (heads, total, cols) packed view as a (1, heads, rows,
// cols) view: one sequence, as forward() takes it.
TensorView sequence_view(const TensorView& packed, std::int64_t row0, std::int64_t rows);

// Element b of a (batch, ...) view with the batch dim kept at size 1.
TensorView batch_element(const TensorView& view, std::int64_t b);

// The options of sequence b: per-batch ALiBi slopes and sinks (batch, Hq) become its row (Hq,).
Options sequence_options(const Options& options, std::int64_t b);

}  // namespace sdpa::detail
