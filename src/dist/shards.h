// What the ring's forward and backward share: the call's checks on one rank (its shards
// against the partition, its signature for the agreement), the pieces of a shard, the
// K/V (and key-padding mask) buffer that travels, and the Problem of one query block
// against one key piece, with the band, ALiBi and dropout of the whole problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "api/validate.h"
#include "common/problem.h"
#include "sdpa/distributed.h"

namespace sdpa::distributed::detail {

using sdpa::detail::Problem;
using sdpa::detail::Shape;

// A contiguous run of a shard's rows: global rows [global, global + rows) stored at
// shard rows [local, local + rows).
struct Piece {
  std::int64_t global = 0, local = 0, rows = 0;
};
std::vector<Piece> shard_pieces(std::int64_t length, int ranks, int rank, Partition partition);

// One rank's view of the call, once its shards are checked.
struct ShardCall {
  int ranks = 1, rank = 0;
  Sharding sharding;
  Shape batch_shape;
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, E = 0, Ev = 0;
  std::int64_t L_shard = 0, S_shard = 0;
  Shape output_shape, lse_shape;  // of this rank's rows, as sdpa::forward's
  DType dtype = DType::float32;
  DType lse_dtype = DType::float32;             // float64 for float64
  std::vector<sdpa::detail::Span> input_spans;  // query, key, value, the mask: no output may overlap them
  Options options;  // the caller's, without the key-padding mask (it travels) and the sinks (folded once, below)
  // The sinks, one logit per query matrix (empty without): they join each row's softmax
  // once, after the last merge (fold_sink, merge.h), never a step's partial softmax,
  // which would count them once per step.
  std::vector<double> sinks;
  std::optional<TensorView> key_padding;
  std::string signature;  // what every rank must agree on
};

// Checks query, key, value, the sharding and the options on this rank (throws
// sdpa::Error naming the argument); no collective.
ShardCall check_shards(MPI_Comm comm, const TensorView& query, const TensorView& key, const TensorView& value,
                       const Sharding& sharding, const Options& options);

// Rows [row0, row0 + rows) of a view's sequence dim (the second last).
TensorView row_slice(const TensorView& view, std::int64_t row0, std::int64_t rows);

// The bytes that travel: K (batch..., Hkv, Sr, E), V (batch..., Hkv, Sr, Ev) packed in
// the input dtype, then the key-padding flags (batch, Sr) when there is a mask, then
// `extra_floats` elements of the accumulation dtype (the backward's dK, dV).
struct KvLayout {
  std::size_t key_bytes = 0, value_bytes = 0, mask_bytes = 0, extra_bytes = 0;
  std::size_t total() const { return key_bytes + value_bytes + mask_bytes + extra_bytes; }
};
KvLayout kv_layout(const ShardCall& call, std::int64_t rows, bool gradients);

// Packs this rank's K, V and mask into `buffer` (layout kv_layout(call, S_shard, ...)).
void pack_kv(const ShardCall& call, const TensorView& key, const TensorView& value, std::byte* buffer);

// Copies keys [from_row, from_row + rows) of a packed buffer of `from_rows` keys (K, V and
// mask, as pack_kv lays them out) to keys [to_row, to_row + rows) of one of `to_rows` keys.
void copy_kv_rows(const ShardCall& call, const std::byte* from, std::int64_t from_rows, std::int64_t from_row,
                  std::byte* to, std::int64_t to_rows, std::int64_t to_row, std::int64_t rows);

// The travelling K, V and mask of a shard of `rows` keys as views of `buffer`.
struct KvViews {
  TensorView key, value;
  std::optional<TensorView> mask;  // (batch..., 1, 1, rows) bool
};
KvViews kv_views(const ShardCall& call, std::int64_t rows, std::byte* buffer);

// The global problem's band (causal, window, alignment), resolved once.
struct GlobalBand {
  std::int64_t window_left = -1, window_right = -1, diagonal_shift = 0;
  // Whether any query of global rows [q, q + q_rows) sees a key of [k, k + k_rows).
  bool visible(std::int64_t q, std::int64_t q_rows, std::int64_t k, std::int64_t k_rows, std::int64_t S) const;
};
GlobalBand global_band(const ShardCall& call);

// The Problem of query rows `query` (global first row q_global) against keys `kv`
// (global first key k_global, key columns [k_col, k_col + k_rows) of the travelling
// shard): the kernels' local indices, the whole problem's band, ALiBi and dropout.
Problem piece_problem(const ShardCall& call, const GlobalBand& band, const TensorView& query, std::int64_t q_global,
                      const KvViews& kv, std::int64_t k_col, std::int64_t k_rows, std::int64_t k_global);

// A contiguous (batch..., heads, rows, cols) view of `data`.
TensorView packed_view(void* data, DType dtype, const Shape& batch_shape, std::int64_t heads, std::int64_t rows,
                       std::int64_t cols);

}  // namespace sdpa::distributed::detail
