#include "dist/shards.h"

#include <cstring>
#include <sstream>

#include "api/operands.h"
#include "api/resolve_options.h"
#include "api/views.h"

namespace sdpa::distributed::detail {

using sdpa::detail::fail;
using sdpa::detail::shape_string;

std::vector<Piece> shard_pieces(std::int64_t length, int ranks, int rank, Partition partition) {
  std::vector<Piece> pieces;
  std::int64_t local = 0;
  for (const RowRange& range : shard_rows(length, ranks, rank, partition)) {
    pieces.push_back({range.begin, local, range.end - range.begin});
    local += range.end - range.begin;
  }
  return pieces;
}

namespace {

const char* partition_name(Partition p) { return p == Partition::zigzag ? "zigzag" : "contiguous"; }
const char* exchange_name(Exchange e) {
  return e == Exchange::all_gather ? "all-gather" : e == Exchange::ordered ? "ordered" : "ring";
}

// The shard's length along the sequence dim (the second last) must be the partition's.
void check_rows(const TensorView& view, const char* name, std::int64_t expected, std::int64_t global, int rank,
                int ranks, Partition partition) {
  const std::int64_t rows = view.shape[view.rank() - 2];
  if (rows != expected)
    fail(name, "expected " + std::to_string(expected) + " rows, rank " + std::to_string(rank) + "'s shard of " +
                   std::to_string(global) + " in a " + partition_name(partition) + " partition over " +
                   std::to_string(ranks) + " ranks, got shape " + shape_string(view.shape));
}

}  // namespace

ShardCall check_shards(MPI_Comm comm, const TensorView& query, const TensorView& key, const TensorView& value,
                       const Sharding& sharding, const Options& options) {
  ShardCall call;
  MPI_Comm_size(comm, &call.ranks);
  MPI_Comm_rank(comm, &call.rank);
  call.sharding = sharding;
  if (sharding.query_length < 0)
    fail("sharding.query_length", "expected >= 0, got " + std::to_string(sharding.query_length));
  if (sharding.key_length < 0) fail("sharding.key_length", "expected >= 0, got " + std::to_string(sharding.key_length));
  sdpa::detail::check_not_quantized(key, value, "ring attention yet (use sdpa::forward on one process)");
  call.options = options;
  call.options.mask.reset();
  const sdpa::detail::CheckedInputs in = sdpa::detail::check_inputs(query, key, value, call.options);
  call.batch_shape = in.batch_shape;
  for (std::int64_t size : in.batch_shape) call.batch *= size;
  call.heads_q = in.heads_q;
  call.heads_kv = in.heads_kv;
  call.E = in.E;
  call.Ev = in.Ev;
  call.dtype = query.dtype;
  call.lse_dtype = in.lse_dtype;
  call.input_spans = sdpa::detail::per_head_spans(call.options);
  // The per-head tensors, one value per query matrix: the sinks leave the pieces' options
  // (ring_forward folds them once); the ALiBi slopes join the signature.
  Problem per_head;
  per_head.batch = call.batch;
  per_head.heads_q = call.heads_q;
  sdpa::detail::resolve_options(call.options, call.dtype, per_head);
  call.sinks = per_head.sinks;
  call.options.sinks.reset();
  for (const auto& [view, name] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}})
    call.input_spans.push_back(sdpa::detail::check_view(*view, name));
  call.output_shape = in.output_shape;
  call.lse_shape = in.lse_shape;
  call.L_shard = shard_length(sharding.query_length, call.ranks, call.rank, sharding.partition);
  call.S_shard = shard_length(sharding.key_length, call.ranks, call.rank, sharding.partition);
  check_rows(query, "query", call.L_shard, sharding.query_length, call.rank, call.ranks, sharding.partition);
  check_rows(key, "key", call.S_shard, sharding.key_length, call.rank, call.ranks, sharding.partition);
  check_rows(value, "value", call.S_shard, sharding.key_length, call.rank, call.ranks, sharding.partition);

  if (options.mask) {
    // A key-padding mask: one bool per key of this shard, (Sr,) or (batch..., 1, 1, Sr).
    const TensorView& mask = *options.mask;
    Shape per_batch = in.batch_shape;
    per_batch.insert(per_batch.end(), {1, 1, call.S_shard});
    if (mask.dtype != DType::boolean)
      fail("mask", std::string("expected a bool key-padding mask in a ring call, got ") + dtype_name(mask.dtype),
           ErrorKind::type);
    if (mask.shape != Shape{call.S_shard} && mask.shape != per_batch)
      fail("mask", "expected a key-padding mask of shape (" + std::to_string(call.S_shard) + ",) or " +
                       shape_string(per_batch) + " (this rank's keys), got " + shape_string(mask.shape));
    call.input_spans.push_back(sdpa::detail::check_view(mask, "mask"));
    call.key_padding = mask;
  }

  // Everything that must be the same on every rank; a rank's own shard lengths are not.
  std::ostringstream s;
  s.precision(17);
  s << "dtype " << dtype_name(call.dtype) << ", batch " << shape_string(call.batch_shape) << ", Hq " << call.heads_q
    << ", Hkv " << call.heads_kv << ", E " << call.E << ", Ev " << call.Ev << ", L " << sharding.query_length << ", S "
    << sharding.key_length << ", " << partition_name(sharding.partition) << " over " << call.ranks
    << ' ' << exchange_name(sharding.exchange) << ", causal "
    << static_cast<int>(options.causal) << ", alignment "
    << (options.alignment ? static_cast<int>(*options.alignment) : -1) << ", window " << options.window_left << ' '
    << options.window_right << ", scale " << options.scale.value_or(0.0) << (options.scale ? "" : " (default)")
    << ", softcap " << options.softcap << ", dropout " << options.dropout_p << " seed " << options.seed << " offset "
    << options.offset << ", backend " << static_cast<int>(options.backend) << ", mask "
    << (options.mask ? "key padding" : "none") << ", alibi ";
  if (options.alibi_slopes) {
    for (double slope : per_head.alibi_slopes) s << slope << ' ';
  } else {
    s << "none";
  }
  s << ", sinks ";
  if (options.sinks) {
    for (double sink : call.sinks) s << sink << ' ';
  } else {
    s << "none";
  }
  call.signature = s.str();
  return call;
}

TensorView row_slice(const TensorView& view, std::int64_t row0, std::int64_t rows) {
  TensorView slice = view;
  slice.strides = view.effective_strides();
  const std::size_t d = view.rank() - 2;
  if (view.numel() > 0)
    slice.data = static_cast<std::byte*>(view.data) +
                 row0 * slice.strides[d] * static_cast<std::int64_t>(dtype_size(view.dtype));
  slice.shape[d] = rows;
  return slice;
}

TensorView packed_view(void* data, DType dtype, const Shape& batch_shape, std::int64_t heads, std::int64_t rows,
                       std::int64_t cols) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.shape = batch_shape;
  view.shape.insert(view.shape.end(), {heads, rows, cols});
  view.strides = contiguous_strides(view.shape);
  return view;
}

KvLayout kv_layout(const ShardCall& call, std::int64_t rows, bool gradients) {
  const std::size_t matrices = static_cast<std::size_t>(call.batch * call.heads_kv);
  const std::size_t element = dtype_size(call.dtype);
  const std::size_t acc = call.dtype == DType::float64 ? 8 : 4;
  const std::size_t r = static_cast<std::size_t>(rows);
  KvLayout layout;
  layout.key_bytes = matrices * r * static_cast<std::size_t>(call.E) * element;
  layout.value_bytes = matrices * r * static_cast<std::size_t>(call.Ev) * element;
  layout.mask_bytes = call.key_padding ? static_cast<std::size_t>(call.batch) * r : 0;
  layout.extra_bytes = gradients ? matrices * r * static_cast<std::size_t>(call.E + call.Ev) * acc : 0;
  return layout;
}

namespace {

// Copies a view of (batch..., heads, rows, cols) into a packed buffer of the same dtype.
void pack(const TensorView& view, const Shape& batch_shape, std::int64_t heads, std::byte* out) {
  const sdpa::detail::Operand op = sdpa::detail::make_operand(view, batch_shape, heads);
  const std::int64_t rows = view.shape[view.rank() - 2], cols = view.shape[view.rank() - 1];
  const std::size_t element = op.element_size;
  for (std::size_t m = 0; m < op.head_offset.size(); ++m)
    for (std::int64_t r = 0; r < rows; ++r) {
      if (op.col_stride == 1) {
        std::memcpy(out, op.address(static_cast<std::int64_t>(m), r, 0), static_cast<std::size_t>(cols) * element);
        out += static_cast<std::size_t>(cols) * element;
      } else {
        for (std::int64_t c = 0; c < cols; ++c, out += element)
          std::memcpy(out, op.address(static_cast<std::int64_t>(m), r, c), element);
      }
    }
}

}  // namespace

void pack_kv(const ShardCall& call, const TensorView& key, const TensorView& value, std::byte* buffer) {
  const KvLayout layout = kv_layout(call, call.S_shard, false);
  pack(key, call.batch_shape, call.heads_kv, buffer);
  pack(value, call.batch_shape, call.heads_kv, buffer + layout.key_bytes);
  if (call.key_padding) {
    // The flags of each batch element, broadcast from (Sr,) where given so.
    Shape target = call.batch_shape;
    target.insert(target.end(), {1, 1, call.S_shard});
    const sdpa::detail::Operand mask = sdpa::detail::make_operand(
        *call.key_padding, call.batch_shape, 1, sdpa::detail::mask_broadcast_strides(*call.key_padding, target));
    std::byte* flags = buffer + layout.key_bytes + layout.value_bytes;
    for (std::int64_t b = 0; b < call.batch; ++b)
      for (std::int64_t j = 0; j < call.S_shard; ++j) *flags++ = *mask.address(b, 0, j);
  }
}

void copy_kv_rows(const ShardCall& call, const std::byte* from, std::int64_t from_rows, std::int64_t from_row,
                  std::byte* to, std::int64_t to_rows, std::int64_t to_row, std::int64_t rows) {
  if (rows == 0) return;
  const KvLayout in = kv_layout(call, from_rows, false), out = kv_layout(call, to_rows, false);
  const std::size_t element = dtype_size(call.dtype);
  // Each part is (matrices, keys, cols) with the key dim second: one run of rows per matrix.
  const auto part = [&](std::size_t in_at, std::size_t out_at, std::int64_t matrices, std::size_t row_bytes) {
    for (std::int64_t m = 0; m < matrices; ++m)
      std::memcpy(to + out_at + static_cast<std::size_t>(m * to_rows + to_row) * row_bytes,
                  from + in_at + static_cast<std::size_t>(m * from_rows + from_row) * row_bytes,
                  static_cast<std::size_t>(rows) * row_bytes);
  };
  const std::int64_t kv_matrices = call.batch * call.heads_kv;
  part(0, 0, kv_matrices, static_cast<std::size_t>(call.E) * element);
  part(in.key_bytes, out.key_bytes, kv_matrices, static_cast<std::size_t>(call.Ev) * element);
  if (call.key_padding) part(in.key_bytes + in.value_bytes, out.key_bytes + out.value_bytes, call.batch, 1);
}

KvViews kv_views(const ShardCall& call, std::int64_t rows, std::byte* buffer) {
  const KvLayout layout = kv_layout(call, rows, false);
  KvViews views;
  views.key = packed_view(buffer, call.dtype, call.batch_shape, call.heads_kv, rows, call.E);
  views.value = packed_view(buffer + layout.key_bytes, call.dtype, call.batch_shape, call.heads_kv, rows, call.Ev);
  if (call.key_padding)
    views.mask =
        packed_view(buffer + layout.key_bytes + layout.value_bytes, DType::boolean, call.batch_shape, 1, 1, rows);
  return views;
}

GlobalBand global_band(const ShardCall& call) {
  Problem whole;
  whole.L = call.sharding.query_length;
  whole.S = call.sharding.key_length;
  whole.E = call.E;
  Options band;  // the band's options alone (ALiBi slopes are per piece)
  band.causal = call.options.causal;
  band.window_left = call.options.window_left;
  band.window_right = call.options.window_right;
  band.alignment = call.options.alignment;
  sdpa::detail::resolve_options(band, call.dtype, whole);
  return {whole.window_left, whole.window_right, whole.diagonal_shift};
}

bool GlobalBand::visible(std::int64_t q, std::int64_t q_rows, std::int64_t k, std::int64_t k_rows,
                         std::int64_t S) const {
  Problem whole;
  whole.S = S;
  whole.window_left = window_left;
  whole.window_right = window_right;
  whole.diagonal_shift = diagonal_shift;
  // O(rows): negligible next to the rows × keys × E of the piece it may skip.
  for (std::int64_t i = q; i < q + q_rows; ++i)
    if (std::max(whole.key_begin(i), k) < std::min(whole.key_end(i), k + k_rows)) return true;
  return false;
}

Problem piece_problem(const ShardCall& call, const GlobalBand& band, const TensorView& query, std::int64_t q_global,
                      const KvViews& kv, std::int64_t k_col, std::int64_t k_rows, std::int64_t k_global) {
  Options options = call.options;
  if (kv.mask) {
    TensorView mask = *kv.mask;
    mask.strides = mask.effective_strides();
    mask.data = static_cast<std::byte*>(mask.data) + k_col * mask.strides.back();
    mask.shape.back() = k_rows;
    options.mask = mask;
  }
  const TensorView key = row_slice(kv.key, k_col, k_rows), value = row_slice(kv.value, k_col, k_rows);
  Problem p = sdpa::detail::resolve_inputs(sdpa::detail::check_inputs(query, key, value, options));
  p.window_left = band.window_left;
  p.window_right = band.window_right;
  p.diagonal_shift = band.diagonal_shift + q_global - k_global;
  p.query_offset = q_global;
  p.key_offset = k_global;
  return p;
}

}  // namespace sdpa::distributed::detail
