// Rows in and out of the SIMD kernels: loads and stores that convert any dtype and
// stride to and from float32 rows, K and V tiles read in place when they can be, and the
// query rows a subtile holds with the keys each sees.
// Included once per Highway target by files that use hwy/foreach_target.h (hence the
// toggling include guard, Highway's convention for per-target headers).
#if defined(SDPA_CPU_SIMD_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SIMD_ROWS_INL_H_
#undef SDPA_CPU_SIMD_ROWS_INL_H_
#else
#define SDPA_CPU_SIMD_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half.h"
#include "common/problem.h"
#include "hwy/highway.h"
// Per-target headers go after highway.h.
#include "cpu/simd/microkernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::detail {
namespace HWY_NAMESPACE {
namespace simd {

// op's rows of matrix `matrix` in order from row j0: each next() gives a row's address
// and moves on to the row after it; fill(out, n) gives the next n at once. A paged op's
// rows are walked page by page, with one division for the first row: Operand::address
// finds a row's page with a 64-bit division and a remainder, tens of cycles each on
// Intel cores, and a decode tile asks for two hundred rows (K's and V's, with those its
// kernels request ahead).
class RowWalker {
 public:
  RowWalker(const Operand& op, std::int64_t matrix, std::int64_t j0)
      : page_offset_(op.page_offset.data()),
        element_size_(static_cast<std::int64_t>(op.element_size)),
        step_(op.row_stride * element_size_) {
    if (!op.paged()) {
      row_ = op.address(matrix, j0, 0);
      return;
    }
    page_rows_ = op.page_rows;
    head_ = op.data + op.head_offset[static_cast<std::size_t>(matrix)] * element_size_;
    page_ = j0 / page_rows_;
    in_page_ = j0 % page_rows_;
    row_ = head_ + page_offset_[page_] * element_size_ + in_page_ * step_;
  }

  const std::byte* next() {
    if (in_page_ == page_rows_) next_page();  // (never when not paged)
    ++in_page_;
    const std::byte* row = row_;
    row_ += step_;
    return row;
  }

  // out[i] = the next `count` rows' addresses: a page's run at a time, each a plain
  // strided loop (the compiler's vectors: 8 addresses a store). next() row by row, with
  // its page test, was ~11 % of an int8 decode's time in cache (Zen 5), a decode tile
  // listing ~200 K and V rows.
  void fill(const std::byte** out, std::int64_t count) {
    while (count > 0) {
      if (in_page_ == page_rows_) next_page();
      const std::int64_t run = std::min(count, page_rows_ - in_page_), step = step_;
      const std::byte* const row = row_;  // (locals: out's stores cannot alias them)
      for (std::int64_t i = 0; i < run; ++i) out[i] = row + i * step;
      row_ = row + run * step;
      in_page_ += run;
      out += run;
      count -= run;
    }
  }

 private:
  void next_page() {
    in_page_ = 0;
    row_ = head_ + page_offset_[++page_] * element_size_;
  }

  const std::int64_t* page_offset_;
  std::int64_t element_size_, step_;
  std::int64_t page_rows_ = std::numeric_limits<std::int64_t>::max(), page_ = 0, in_page_ = 0;
  const std::byte* head_ = nullptr;
  const std::byte* row_ = nullptr;
};

// Requests the 64-byte line at `line` into L2 from a loop of requests alone. (asm
// volatile, not _mm_prefetch: GCC 12 deleted such a loop of prefetch builtins as a loop
// without effects — the binary had no prefetch in it. The decode kernels' _mm_prefetch
// sits among their loads and stays.)
HWY_INLINE void RequestLineInLoop(const std::byte* line) {
#if HWY_ARCH_X86
  asm volatile("prefetcht1 %0" : : "m"(*line));
#else
  hwy::Prefetch(line);
#endif
}

// Requests every 64-byte line of op's rows [j0, j0 + cols) (`width` elements each) into
// L2 in one burst, for rows of unit column stride (others are left to the hardware). A
// task whose rows are its KV head's whole group of query rows (no other task reads those
// rows through the cache: a decode of 9 or more rows a KV head, a short chunk of a
// prefill) requests its next tile's rows as a tile starts, where the tile kernels do not
// request them themselves as they compute (rows they read in place: Task's
// TileKernelsRequest) — rows that a tile copies or converts (float16, strided, paged).
// The hardware prefetcher alone left them waiting: Zen 4, two threads, float32 (before
// the tile kernels requested), GQA 32/8, L = 16, S = 8192 13.07–14.06 → 12.51–12.80 ms;
// L = 4, S = 32768 25.1–27.8 → 20.9–22.2 ms (bench/RESULTS.md).
inline void PrefetchRows(const Operand& op, std::int64_t matrix, std::int64_t j0, std::int64_t cols,
                         std::int64_t width) {
  if (op.col_stride != 1) return;
  RowWalker rows(op, matrix, j0);
  const std::int64_t bytes = width * static_cast<std::int64_t>(op.element_size);
  for (std::int64_t c = 0; c < cols; ++c) {
    const std::byte* row = rows.next();
    for (std::int64_t b = 0; b < bytes; b += 64) RequestLineInLoop(row + b);
  }
}

// `bytes` bytes from `from` to `to`, whole vectors inline and the last partial one by
// memcpy: a small head's rows are a few hundred bytes, and a libc memcpy call per row
// (its dispatch and size checks) cost more than the copy. Bytes, not floats: a row of a
// caller's float32 tensor may start at any address.
inline void CopyRowBytes(std::byte* HWY_RESTRICT to, const std::byte* HWY_RESTRICT from, std::size_t bytes) {
  const hn::ScalableTag<std::uint8_t> du8;
  const std::size_t N = hn::Lanes(du8);
  auto* dst = reinterpret_cast<std::uint8_t*>(to);
  const auto* src = reinterpret_cast<const std::uint8_t*>(from);
  std::size_t x = 0;
  for (; x + N <= bytes; x += N) hn::StoreU(hn::LoadU(du8, src + x), du8, dst + x);
  if (x < bytes) std::memcpy(dst + x, src + x, bytes - x);
}

// Whether hn::PromoteTo widens float16 vectors exactly on this target. Highway 1.0 does
// with F16C (x86 from its AVX2 target up); its emulation below maps exponent 31 (inf,
// NaN) to finite numbers (0x7C00 → 65536), so float16 is widened a value at a time there.
constexpr bool kVectorHalfToFloat = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;

// N values of a row at p as float32 lanes, widened exactly (int8: q, without its scale).
HWY_INLINE VF WidenRow(const float* HWY_RESTRICT p) { return hn::LoadU(DF(), p); }
HWY_INLINE VF WidenRow(const std::int8_t* HWY_RESTRICT p) {
  const DF df;
  const hn::Rebind<std::int32_t, DF> di;
  const hn::Rebind<std::int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}
HWY_INLINE VF WidenRow(const hwy::bfloat16_t* HWY_RESTRICT p) {
  return hn::PromoteTo(DF(), hn::LoadU(hn::Rebind<hwy::bfloat16_t, DF>(), p));
}
HWY_INLINE VF WidenRow(const hwy::float16_t* HWY_RESTRICT p) {
  const DF df;
  if constexpr (kVectorHalfToFloat) {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), p));
  } else {
    HWY_ALIGN float lanes[HWY_MAX_BYTES / sizeof(float)];
    for (std::size_t i = 0; i < hn::Lanes(df); ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, p + i, 2);
      lanes[i] = fp16_to_float(bits);
    }
    return hn::Load(df, lanes);
  }
}

// Value e of a row (the dims past whole vectors).
HWY_INLINE float ToFloat(const float* row, std::int64_t e) { return row[e]; }
HWY_INLINE float ToFloat(const std::int8_t* row, std::int64_t e) { return static_cast<float>(row[e]); }
HWY_INLINE float ToFloat(const hwy::bfloat16_t* row, std::int64_t e) {
  std::uint16_t bits;
  std::memcpy(&bits, row + e, 2);
  return bf16_to_float(bits);
}
HWY_INLINE float ToFloat(const hwy::float16_t* row, std::int64_t e) {
  std::uint16_t bits;
  std::memcpy(&bits, row + e, 2);
  return fp16_to_float(bits);
}

// Elements [col0, col0+count) of row `row` of matrix `matrix`, converted to float32.
// The dtype switch is hoisted out of the loop; contiguous float16/bfloat16 rows convert
// a vector at a time (WidenRow).
inline void LoadRow(const Operand& op, std::int64_t matrix, std::int64_t row, std::int64_t col0, std::int64_t count,
                    float* out) {
  if (count <= 0) return;  // an empty row may have no memory behind it
  const std::byte* base = op.address(matrix, row, col0);
  const std::int64_t step = op.col_stride;
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  auto each = [&](auto convert, std::int64_t size) {
    for (std::int64_t c = 0; c < count; ++c) out[c] = convert(base + c * step * size);
  };
  switch (op.dtype) {
    case DType::float32:
      if (step == 1) {  // a contiguous row (paged K/V rows are copied this way)
        CopyRowBytes(reinterpret_cast<std::byte*>(out), base, static_cast<std::size_t>(count) * 4);
        return;
      }
      each([](const std::byte* p) { float v; std::memcpy(&v, p, 4); return v; }, 4);
      return;
    case DType::float64:
      each([](const std::byte* p) { double v; std::memcpy(&v, p, 8); return static_cast<float>(v); }, 8);
      return;
    case DType::boolean:
      each([](const std::byte* p) { return *p != std::byte{0} ? 1.0f : 0.0f; }, 1);
      return;
    case DType::int8: {  // quantized K/V rows: q exactly (the scale is the caller's)
      std::int64_t c = 0;
      if (step == 1) {
        for (; c + N <= count; c += N)
          hn::StoreU(WidenRow(reinterpret_cast<const std::int8_t*>(base) + c), df, out + c);
      }
      for (const std::byte* at = base + c * step; c < count; ++c, at += step)
        out[c] = static_cast<float>(static_cast<std::int8_t>(*at));
      return;
    }
    case DType::float16:
    case DType::bfloat16: {
      const bool half = op.dtype == DType::float16;
      std::int64_t c = 0;
      if (step == 1) {
        for (; c + N <= count; c += N) {
          const VF v = half ? WidenRow(reinterpret_cast<const hwy::float16_t*>(base) + c)
                            : WidenRow(reinterpret_cast<const hwy::bfloat16_t*>(base) + c);
          hn::StoreU(v, df, out + c);
        }
      }
      for (const std::byte* at = base + c * step * 2; c < count; ++c, at += step * 2) {
        std::uint16_t bits;
        std::memcpy(&bits, at, 2);
        out[c] = half ? fp16_to_float(bits) : bf16_to_float(bits);
      }
      return;
    }
  }
}

// Stores `count` float32 values into row `row` of `op` from column `col0`, rounded to
// its dtype (nearest even), with the dtype switch hoisted out of the loop.
inline void StoreRow(const Operand& op, std::int64_t matrix, std::int64_t row, std::int64_t col0, std::int64_t count,
                     const float* in) {
  if (count <= 0) return;
  std::byte* base = op.address(matrix, row, col0);
  const std::int64_t step = op.col_stride * static_cast<std::int64_t>(op.element_size);
  auto each = [&](auto store) {
    for (std::int64_t c = 0; c < count; ++c) store(base + c * step, in[c]);
  };
  switch (op.dtype) {
    case DType::float32:
      if (step == 4) {  // a contiguous row
        CopyRowBytes(base, reinterpret_cast<const std::byte*>(in), static_cast<std::size_t>(count) * 4);
        return;
      }
      each([](std::byte* p, float v) { std::memcpy(p, &v, 4); });
      return;
    case DType::float64:
      each([](std::byte* p, float v) { const double d = v; std::memcpy(p, &d, 8); });
      return;
    case DType::float16:
      each([](std::byte* p, float v) { const std::uint16_t h = float_to_fp16(v); std::memcpy(p, &h, 2); });
      return;
    case DType::bfloat16:
      each([](std::byte* p, float v) { const std::uint16_t h = float_to_bf16(v); std::memcpy(p, &h, 2); });
      return;
    case DType::boolean:
    case DType::int8:
      return;  // never an output dtype (validated)
  }
}

// The scales of rows [j0, j0+cols) of an int8 K or V (Problem::key_scale, value_scale),
// paged or not, into `out`.
inline void LoadScales(const Operand& scale, std::int64_t matrix, std::int64_t j0, std::int64_t cols, float* out) {
  // float32 (validated), at any address: the bytes, with no dtype switch or page lookup
  // per scale where not paged (the two cost an int8 decode ~8 % of its time).
  if (!scale.paged() && scale.row_stride == 1) {  // a cache's (B, Hkv, S) scales: one run
    std::memcpy(out, scale.address(matrix, j0, 0), static_cast<std::size_t>(cols) * sizeof(float));
    return;
  }
  RowWalker rows(scale, matrix, j0);
  for (std::int64_t c = 0; c < cols; ++c) std::memcpy(out + c, rows.next(), sizeof(float));
}

// Requests the lines of LoadScales' run of scales [j0, j0 + cols) into L2: a cache's (B,
// Hkv, S) scales, one run (paged scales are left to their loads, whose page walk a
// request would repeat; strided ones, no run, likewise). An int8 decode tile copies its
// 192 keys' scales of K as it starts and of V before its P·V, 12 lines each, and
// unrequested they came from memory then, the core waiting (an experiment that read
// every tile's scales from one cached run: 6 alternating rounds, each faster, 2.52–3.23
// ms against 2.81–3.84 a call, S = 65536, GQA 32/8, two threads). Requested a tile
// ahead (Task::RequestTile): 10 alternating rounds, each faster, median 3.52 → 3.29 ms
// (docs/performance.md, "The int8 scales requested").
inline void RequestScales(const Operand& scale, std::int64_t matrix, std::int64_t j0, std::int64_t cols) {
  if (scale.paged() || scale.row_stride != 1 || cols <= 0) return;
  const auto* first = static_cast<const std::byte*>(scale.address(matrix, j0, 0));
  // Offsets within the run (no pointer past it): its first line, then each next line's
  // start up to its last scale.
  const std::int64_t last = (cols - 1) * static_cast<std::int64_t>(sizeof(float));
  const auto skew = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(first) % 64);
  RequestLineInLoop(first);
  for (std::int64_t b = 64 - skew; b <= last; b += 64) RequestLineInLoop(first + b);
}

// Table indices that spread consecutive floats over groups of `group` lanes: lane i takes
// element i / group (a key's scale to its rows' scores).
HWY_INLINE auto SpreadIndices(std::int64_t group) {
  HWY_ALIGN std::int32_t index[HWY_MAX_BYTES / sizeof(float)];
  const auto N = static_cast<std::int64_t>(hn::Lanes(DF()));
  // (Counted, not divided: a division a lane, once a tile, cost a decode ~5 %.)
  for (std::int64_t i = 0, element = 0; i < N; ++element)
    for (std::int64_t k = 0; k < group && i < N; ++k) index[i++] = static_cast<std::int32_t>(element);
  return hn::SetTableIndices(DF(), index);
}

// xt[c·stride + ·] *= factor[c] for c < cols: a column of a transposed tile (Sᵀ, Pᵀ)
// times its key's scale. A stride of whole vectors (a column of rows) takes a broadcast
// a column; a smaller one (a decode's dense Sᵀ, a power of two) puts N/stride columns in
// a vector and takes their factors by one table lookup, reading factor up to N − 1
// floats past cols and scaling the last vector's padding columns too (which P·V does not
// read: they may turn NaN).
inline void ScaleColumns(float* xt, std::size_t stride, std::int64_t cols, const float* factor) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  if (stride < N) {
    const auto spread = SpreadIndices(static_cast<std::int64_t>(stride));
    for (std::int64_t c = 0; c < cols; c += static_cast<std::int64_t>(N / stride)) {
      float* at = xt + c * stride;
      hn::Store(hn::Mul(hn::Load(df, at), hn::TableLookupLanes(hn::LoadU(df, factor + c), spread)), df, at);
    }
    return;
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    const VF f = hn::Set(df, factor[c]);
    for (std::size_t lane0 = 0; lane0 < stride; lane0 += N)
      hn::Store(hn::Mul(hn::Load(df, xt + c * stride + lane0), f), df, xt + c * stride + lane0);
  }
}

// Whether `op`'s rows are float32 rows that the kernels may read (or write) through float
// pointers: unit column stride, not paged, float-aligned (a caller's float32 tensor may
// start at any address; every element then lies 4 bytes apart from it).
inline bool FloatRows(const Operand& op) {
  return op.dtype == DType::float32 && op.col_stride == 1 && !op.paged() &&
         reinterpret_cast<std::uintptr_t>(op.data) % alignof(float) == 0;
}

// Rows [j0, j0+cols) of K or V as float32 with unit column stride: the input itself
// when it already is (no copy), else converted into `tile`, zero-padded to `padded` rows
// so that whole register blocks can run over it. The forward asks for no padding
// (ScoreTile reads no row past cols); the backward's score blocks still need it.
inline const float* KeyValueRows(const Operand& op, std::int64_t matrix, std::int64_t j0, std::int64_t cols,
                                 std::int64_t padded, std::int64_t width, float* tile, std::int64_t* stride) {
  if (FloatRows(op) && cols == padded) {
    *stride = op.row_stride;
    return reinterpret_cast<const float*>(op.address(matrix, j0, 0));
  }
  for (std::int64_t c = 0; c < cols; ++c) LoadRow(op, matrix, j0 + c, 0, width, tile + c * width);
  std::fill(tile + cols * width, tile + padded * width, 0.0f);
  *stride = width;
  return tile;
}

// Rows [j0, j0+cols) of a bfloat16 K or V with unit column stride: the input itself
// when it is laid out so, else a zero-padded copy. Rows read in pairs along the width
// (`pairs`: K in the forward, K and V in the backward) pad an odd width to even.
inline const std::uint16_t* Bf16Rows(const Operand& op, std::int64_t matrix, std::int64_t j0, std::int64_t cols,
                                     std::int64_t padded, std::int64_t width, bool pairs, std::uint16_t* tile,
                                     std::int64_t* stride) {
  const bool odd = pairs && width % 2 != 0;
  const bool bf16_rows = op.dtype == DType::bfloat16 && op.col_stride == 1 && !op.paged();
  if (bf16_rows && cols == padded && !odd) {
    *stride = op.row_stride;
    return reinterpret_cast<const std::uint16_t*>(op.address(matrix, j0, 0));
  }
  const std::int64_t width_even = odd ? width + 1 : width;
  std::fill(tile, tile + padded * width_even, std::uint16_t{0});
  for (std::int64_t c = 0; c < cols; ++c)
    if (bf16_rows)  // (a partial tile, or an odd width)
      std::memcpy(tile + c * width_even, op.address(matrix, j0 + c, 0), static_cast<std::size_t>(width) * 2);
    else
      for (std::int64_t e = 0; e < width; ++e)
        tile[c * width_even + e] = float_to_bf16(op.load<float>(matrix, j0 + c, e));
  *stride = width_even;
  return tile;
}

// A query row of a task: which (matrix, head, i) it is and which keys it sees:
// [key_begin, key_end) (causal and the sliding window).
struct Row {
  std::int64_t matrix, head, i, key_begin, key_end;
};

// The query rows of one subtile (the rest of its lanes are padding).
struct RowSet {
  std::vector<Row> rows;
  std::int64_t key_start = 0;      // no row sees a key before it
  std::int64_t key_limit = 0;      // no row sees a key at or past it
  std::int64_t max_key_begin = 0;  // every row sees the keys in [max_key_begin, min_key_end)
  std::int64_t min_key_end = 0;
};

// f(r0, r1) for each run [r0, r1) of `rows` that are consecutive rows of one matrix,
// e.g. a subtile's rows of one head (GQA subtiles cross heads): each run is one strided
// block to transpose straight from the input or into the output.
template <class F>
void ForEachRun(const std::vector<Row>& rows, F&& f) {
  const auto continues = [&](std::size_t r) {
    return rows[r].matrix == rows[r - 1].matrix && rows[r].i == rows[r - 1].i + 1;
  };
  for (std::size_t r0 = 0, r1; r0 < rows.size(); r0 = r1) {
    for (r1 = r0 + 1; r1 < rows.size() && continues(r1);) ++r1;
    f(r0, r1);
  }
}

// Fills `set` with rows [first, first + count) of the flattened (group heads × L) query
// rows that share KV head `head_kv` of batch `b` (GQA: a KV head serves Hq/Hkv query
// heads). Works for the forward's and the backward's problem alike.
template <class AnyProblem>
void AssignRows(const AnyProblem& p, std::int64_t b, std::int64_t head_kv, std::int64_t first, std::int64_t count,
                RowSet& set) {
  const std::int64_t group = p.heads_q / p.heads_kv;
  set.rows.clear();
  set.key_start = p.S;
  set.key_limit = 0;
  set.max_key_begin = 0;
  set.min_key_end = p.S;
  // (head, i) of flat row `first`, then stepped: one division per subtile, not two per
  // row (a 64-bit division costs tens of cycles on Intel cores, and a small head's
  // subtile is all setup).
  std::int64_t head = head_kv * group + first / p.L, i = first % p.L;
  const auto next_row = [&] {
    if (++i == p.L) {
      i = 0;
      ++head;
    }
  };
  for (std::int64_t n = 0; n < count; ++n, next_row()) {
    const Row row{p.q_matrix(b, head), head, i, p.key_begin(i), p.key_end(i)};
    if (row.key_begin >= row.key_end) {  // sees no key (the window or causal hides all)
      set.rows.push_back({row.matrix, head, i, 0, 0});
      set.max_key_begin = p.S;
      set.min_key_end = 0;
      continue;
    }
    set.rows.push_back(row);
    set.key_start = std::min(set.key_start, row.key_begin);
    set.key_limit = std::max(set.key_limit, row.key_end);
    set.max_key_begin = std::max(set.max_key_begin, row.key_begin);
    set.min_key_end = std::min(set.min_key_end, row.key_end);
  }
  if (set.key_limit == 0) set.key_start = 0;  // no row sees anything: an empty range
}

// The first key tile to visit for rows that see nothing before `key_start`, in a loop
// that starts at `begin` and steps by `tile` keys (tiles stay on that grid).
inline std::int64_t FirstTile(std::int64_t begin, std::int64_t key_start, std::int64_t tile) {
  return key_start <= begin ? begin : begin + (key_start - begin) / tile * tile;
}

}  // namespace simd
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace sdpa::detail
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SIMD_ROWS_INL_H_
