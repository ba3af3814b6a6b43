// forward_paged (include/sdpa/sdpa.h), the paged KV cache: against forward() on the same
// keys held contiguously, with pages shuffled, both page layouts, poison past each
// sequence's end and in unused pages, every dtype and modifier; and the rejection of bad
// block tables, seq_lens, pages, masks, weights and slopes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "testing/cases.h"
#include "testing/rejection.h"
#include "testing/sequences.h"

namespace sdpa::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Paged {
  Tensor q;        // (B, Hq, L, E)
  StridedCopy qs;  // the query stored (B, L, Hq, E), when asked
  TensorView query() const { return qs.storage.nbytes() ? qs.view : q.view(); }
  std::vector<Tensor> keys, values;  // per sequence (1, Hkv, S_b, E / Ev), contiguous
  Tensor key_storage, value_storage;
  Tensor slopes, sinks;
  PagedKV cache;
};

// The pages of a (pages, Hkv, page, dim) cache: packed, or stored token-major as
// (pages, page, Hkv, dim) and viewed through permuted strides.
TensorView pages_view(Tensor& storage, std::int64_t pages, std::int64_t heads, std::int64_t page, std::int64_t dim,
                      bool token_major) {
  TensorView v = storage.view();
  v.shape = {pages, heads, page, dim};
  v.strides = token_major ? Shape{page * heads * dim, dim, heads * dim, 1} : contiguous_strides(v.shape);
  return v;
}

// Builds each sequence's contiguous K/V, then scatters them into shuffled pages. Rows
// past a sequence's end and pages no sequence uses hold `poison`; block table entries past
// a sequence's last page point at a poison page.
Paged make_paged(DType dtype, const std::vector<std::int64_t>& seq_lens, std::int64_t page, bool token_major,
                 std::int64_t Hq, std::int64_t Hkv, std::int64_t L, std::int64_t E, std::int64_t Ev, double poison,
                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Paged p;
  const std::int64_t B = static_cast<std::int64_t>(seq_lens.size());
  p.q = random_tensor(dtype, {B, Hq, L, E}, rng);
  std::int64_t used = 0, most = 0;
  for (std::int64_t S : seq_lens) {
    p.keys.push_back(random_tensor(dtype, {1, Hkv, S, E}, rng));
    p.values.push_back(random_tensor(dtype, {1, Hkv, S, Ev}, rng));
    used += (S + page - 1) / page;
    most = std::max(most, (S + page - 1) / page);
  }
  const std::int64_t pages = used + 2, bps = most + 1;
  std::vector<std::int64_t> order(static_cast<std::size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const std::int64_t poison_page = order[static_cast<std::size_t>(used)];
  p.key_storage = Tensor(dtype, token_major ? Shape{pages, page, Hkv, E} : Shape{pages, Hkv, page, E});
  p.value_storage = Tensor(dtype, token_major ? Shape{pages, page, Hkv, Ev} : Shape{pages, Hkv, page, Ev});
  for (std::int64_t n = 0; n < p.key_storage.numel(); ++n) p.key_storage.set(n, poison);
  for (std::int64_t n = 0; n < p.value_storage.numel(); ++n) p.value_storage.set(n, poison);
  p.cache.key_pages = pages_view(p.key_storage, pages, Hkv, page, E, token_major);
  p.cache.value_pages = pages_view(p.value_storage, pages, Hkv, page, Ev, token_major);
  p.cache.blocks_per_sequence = bps;
  p.cache.seq_lens = seq_lens;
  p.cache.block_table.assign(static_cast<std::size_t>(B * bps), poison_page);
  std::int64_t next = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t blk = 0; blk < (seq_lens[b] + page - 1) / page; ++blk)
      p.cache.block_table[static_cast<std::size_t>(b * bps + blk)] = order[static_cast<std::size_t>(next++)];
  auto scatter = [&](const Tensor& seq, Tensor& storage, std::int64_t dim, std::int64_t b) {
    const std::int64_t S = seq_lens[b];
    const Shape st = pages_view(storage, pages, Hkv, page, dim, token_major).strides;
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t j = 0; j < S; ++j) {
        const std::int64_t pg = p.cache.block_table[static_cast<std::size_t>(b * bps + j / page)];
        for (std::int64_t e = 0; e < dim; ++e)
          storage.set(pg * st[0] + h * st[1] + (j % page) * st[2] + e, seq.get((h * S + j) * dim + e));
      }
  };
  for (std::int64_t b = 0; b < B; ++b) {
    scatter(p.keys[static_cast<std::size_t>(b)], p.key_storage, E, b);
    scatter(p.values[static_cast<std::size_t>(b)], p.value_storage, Ev, b);
  }
  return p;
}

// Batch element b of a (B, ...) packed tensor as a (1, ...) view.
TensorView batch_element(const Tensor& t, std::int64_t b) {
  TensorView v = t.view();
  const std::int64_t per = t.numel() / t.shape()[0];
  v.data = static_cast<std::byte*>(v.data) + b * per * static_cast<std::int64_t>(dtype_size(t.dtype()));
  v.shape[0] = 1;
  return v;
}

// forward_paged against forward() on each sequence's contiguous K/V, and the sequence of
// length 0 against zeros / −inf.
void expect_paged_matches(Paged& p, const Options& o, DType dtype, std::int64_t Ev) {
  const ForwardResult paged = forward_paged(p.query(), p.cache, o, Returns{false, true});
  const std::int64_t B = p.q.shape()[0];
  ASSERT_EQ(paged.output.shape(), (Shape{B, p.q.shape()[1], p.q.shape()[2], Ev}));
  ASSERT_EQ(paged.lse.shape(), (Shape{B, p.q.shape()[1], p.q.shape()[2]}));
  for (std::int64_t b = 0; b < B; ++b) {
    Options ob = o;
    if (o.alibi_slopes) ob.alibi_slopes = per_head_of_sequence(p.slopes, b);
    if (o.sinks) ob.sinks = per_head_of_sequence(p.sinks, b);
    const ForwardResult alone = forward(batch_element(p.q, b), p.keys[static_cast<std::size_t>(b)].view(),
                                        p.values[static_cast<std::size_t>(b)].view(), ob, Returns{false, true});
    const Tensor want = to_float64(alone.output.view()), want_lse = to_float64(alone.lse.view());
    const Tensor got = to_float64(batch_element(paged.output, b)), got_lse = to_float64(batch_element(paged.lse, b));
    EXPECT_LE(max_abs_diff(got, want), same_result_tolerance(dtype, max_abs(want))) << "sequence " << b;
    EXPECT_LE(max_abs_diff(got_lse, want_lse), same_result_tolerance(DType::float32, max_abs(want_lse)))
        << "sequence " << b;
    if (p.cache.seq_lens[static_cast<std::size_t>(b)] == 0) {
      for (std::int64_t n = 0; n < got.numel(); ++n) EXPECT_EQ(got.get(n), 0.0) << "sequence " << b;
      for (std::int64_t n = 0; n < got_lse.numel() && !o.sinks; ++n)
        EXPECT_EQ(got_lse.get(n), -kInf) << "sequence " << b;
    }
  }
}

TEST(Paged, EqualsForwardOnTheContiguousCache) {
  const std::vector<std::int64_t> seq_lens = {0, 1, 7, 16, 45, 130};
  const std::int64_t Hq = 4, Hkv = 2, E = 32, Ev = 16;
  int n = 0;
  for (std::int64_t page : {1, 3, 16, 100})
    for (bool token_major : {false, true})
      for (Backend backend : {Backend::reference, Backend::cpu})
        for (int variant = 0; variant < 3; ++variant) {
          const std::int64_t L = variant == 0 ? 1 : 4;
          SCOPED_TRACE(::testing::Message() << "page " << page << " token-major " << token_major << " backend "
                                            << static_cast<int>(backend) << " variant " << variant);
          // A finite poison: a kernel that reads a key past the sequence's end or an
          // unused page gets a score of ~±1e3 and a visibly wrong output.
          Paged p = make_paged(DType::float32, seq_lens, page, token_major, Hq, Hkv, L, E, Ev, 300.0, ++n);
          Options o;
          o.backend = backend;
          if (variant == 1) o.causal = Causal::bottom_right;  // the L queries are the sequence's last
          if (variant == 2) {
            o.causal = Causal::bottom_right;
            o.window_left = 20;
            p.slopes = alibi_slopes(DType::float32, {6}, Hq, true);
            o.alibi_slopes = p.slopes.view();
            o.softcap = 30;
            p.sinks = sink_logits(DType::float32, {6}, Hq, true);
            o.sinks = p.sinks.view();
          }
          expect_paged_matches(p, o, DType::float32, Ev);
        }
}

TEST(Paged, LowPrecisionAndPerHeadSlopes) {
  const std::vector<std::int64_t> seq_lens = {33, 0, 200, 5};
  int n = 0;
  // L = 3: 9 query rows a KV head (the tiles); L = 1: 3 (the decode row kernels, which
  // read bfloat16 and float16 pages in place).
  for (std::int64_t L : {3, 1})
    for (DType dtype : {DType::bfloat16, DType::float16, DType::float64})
      for (Backend backend : {Backend::reference, Backend::cpu})
        for (bool token_major : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " backend " << static_cast<int>(backend)
                                            << " token-major " << token_major << " L " << L);
          Paged p = make_paged(dtype, seq_lens, 16, token_major, 6, 2, L, 64, 24, 300.0, 50 + ++n);
          if (token_major) p.qs = heads_interleaved(p.q);  // a (B, L, Hq, E) query buffer
          p.slopes = alibi_slopes(DType::float64, {4}, 6, false);
          Options o;
          o.backend = backend;
          o.causal = Causal::bottom_right;
          o.alibi_slopes = p.slopes.view();
          o.window_left = 50;
          p.sinks = sink_logits(DType::float64, {4}, 6, false);
          o.sinks = p.sinks.view();
          expect_paged_matches(p, o, dtype, 24);
        }
}

// A long sequence (S = 5000, the length where the contiguous forward splits the keys)
// among short ones.
TEST(Paged, LongSequenceAmongShortOnes) {
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend));
    Paged p = make_paged(DType::float32, {5000, 3, 2500}, 16, true, 4, 1, 1, 16, 8, 300.0, 70);
    p.slopes = alibi_slopes(DType::float32, {3}, 4, true);
    Options o;
    o.backend = backend;
    o.alibi_slopes = p.slopes.view();
    o.window_left = 3000;
    o.softcap = 15;
    expect_paged_matches(p, o, DType::float32, 8);
  }
}

// Keys past seq_lens[b] and block table entries past a sequence's last page are not
// read: NaN there changes nothing, and −1 entries there are accepted.
TEST(Paged, RowsPastTheEndAndUnusedPagesAreNotRead) {
  for (Backend backend : {Backend::reference, Backend::cpu})
    for (std::int64_t page : {3, 16}) {
      SCOPED_TRACE(::testing::Message() << "backend " << static_cast<int>(backend) << " page " << page);
      Paged p = make_paged(DType::float32, {5, 0, 17, 40}, page, false, 2, 1, 2, 8, 8, kNaN, 60);
      Options o;
      o.backend = backend;
      expect_paged_matches(p, o, DType::float32, 8);
      const ForwardResult r = forward_paged(p.q.view(), p.cache, o);
      for (std::int64_t n = 0; n < r.output.numel(); ++n) EXPECT_FALSE(std::isnan(r.output.get(n))) << n;
      // Being unread, entries past a sequence's last page may be anything, −1 included.
      PagedKV padded_table = p.cache;
      for (std::int64_t b = 0; b < 4; ++b)
        for (std::int64_t blk = (p.cache.seq_lens[b] + page - 1) / page; blk < p.cache.blocks_per_sequence; ++blk)
          padded_table.block_table[static_cast<std::size_t>(b * p.cache.blocks_per_sequence + blk)] = -1;
      const ForwardResult minus_one = forward_paged(p.q.view(), padded_table, o);
      EXPECT_TRUE(bitwise_equal(r.output, minus_one.output));
    }
}

struct PagedCall {
  Tensor q, key_pages, value_pages, out, lse, weights, mask;
  PagedKV cache;
  Options options;
};

// B = 2, Hq = 2, Hkv = 1, L = 1, E = 4, Ev = 3; 5 pages of 4 rows, 2 blocks per sequence.
PagedCall valid_paged_call() {
  std::mt19937_64 rng(1);
  PagedCall c;
  c.q = random_tensor(DType::float32, {2, 2, 1, 4}, rng);
  c.key_pages = random_tensor(DType::float32, {5, 1, 4, 4}, rng);
  c.value_pages = random_tensor(DType::float32, {5, 1, 4, 3}, rng);
  c.out = Tensor(DType::float32, {2, 2, 1, 3});
  c.lse = Tensor(DType::float32, {2, 2, 1});
  c.weights = Tensor(DType::float32, {2, 2, 1, 8});
  c.mask = Tensor(DType::boolean, {1, 8});
  c.cache.key_pages = c.key_pages.view();
  c.cache.value_pages = c.value_pages.view();
  c.cache.block_table = {3, 1, 4, 0};
  c.cache.blocks_per_sequence = 2;
  c.cache.seq_lens = {5, 3};
  fill_with_sentinel({&c.out, &c.lse});
  return c;
}

void expect_paged_rejected(const PagedCall& c, const std::string& names, bool with_weights = false) {
  const ForwardOutputs outputs = caller_buffers(c.out, c.lse, c.weights, with_weights);
  expect_rejected_naming([&] { forward_paged(c.q.view(), c.cache, outputs, c.options); }, names, {&c.out, &c.lse});
}

// int8 pages with their scale pages (Options::key_scale, value_scale: the pages' shape
// without the last dim), both page layouts, the reference and CPU backends: equal to
// forward() on each sequence's contiguous int8 K/V (quantize_kv quantizes row by row, so
// the pages and the contiguous copy hold the same q and scales). Poison rows past each
// sequence's end quantize too, and must not be read.
TEST(Paged, Int8PagesWithScalesEqualForwardOnTheContiguousInt8Cache) {
  const std::vector<std::int64_t> seq_lens = {0, 1, 30, 4100};
  const std::int64_t Hq = 8, Hkv = 2, E = 32, Ev = 16, page = 16;
  int n = 0;
  for (bool token_major : {false, true})
    for (Backend backend : {Backend::reference, Backend::cpu})
      for (std::int64_t L : {1, 4}) {
        SCOPED_TRACE(::testing::Message() << "token-major " << token_major << " backend "
                                          << static_cast<int>(backend) << " L " << L);
        Paged p = make_paged(DType::float32, seq_lens, page, token_major, Hq, Hkv, L, E, Ev, 300.0, 90 + ++n);
        const std::int64_t pages = p.cache.key_pages.shape[0];
        const QuantizedKV k8 = quantize_kv(p.key_storage.view()), v8 = quantize_kv(p.value_storage.view());
        auto scale_pages = [&](const Tensor& scale) {  // (pages, Hkv, page), stored HND or NHD
          TensorView view = scale.view();
          view.shape = {pages, Hkv, page};
          view.strides = token_major ? Shape{page * Hkv, 1, Hkv} : Shape{Hkv * page, page, 1};
          return view;
        };
        PagedKV cache = p.cache;
        cache.key_pages.data = const_cast<void*>(k8.values.data());
        cache.key_pages.dtype = DType::int8;
        cache.value_pages.data = const_cast<void*>(v8.values.data());
        cache.value_pages.dtype = DType::int8;
        Options o;
        o.backend = backend;
        o.causal = Causal::bottom_right;
        o.key_scale = scale_pages(k8.scale);
        o.value_scale = scale_pages(v8.scale);
        const ForwardResult paged = forward_paged(p.query(), cache, o, Returns{false, true});
        for (std::size_t b = 0; b < seq_lens.size(); ++b) {
          const QuantizedKV kb = quantize_kv(p.keys[b].view()), vb = quantize_kv(p.values[b].view());
          Options ob = o;
          ob.key_scale = kb.scale.view();
          ob.value_scale = vb.scale.view();
          const ForwardResult alone = forward(batch_element(p.q, static_cast<std::int64_t>(b)), kb.values.view(),
                                              vb.values.view(), ob, Returns{false, true});
          const Tensor want = to_float64(alone.output.view());
          const Tensor got = to_float64(batch_element(paged.output, static_cast<std::int64_t>(b)));
          EXPECT_LE(max_abs_diff(got, want), same_result_tolerance(DType::float32, max_abs(want))) << "sequence " << b;
          const Tensor want_lse = to_float64(alone.lse.view());
          const Tensor got_lse = to_float64(batch_element(paged.lse, static_cast<std::int64_t>(b)));
          EXPECT_LE(max_abs_diff(got_lse, want_lse), same_result_tolerance(DType::float32, max_abs(want_lse)));
        }
        // The scale pages are checked like any argument: missing, or of the wrong shape.
        Options missing = o;
        missing.value_scale.reset();
        expect_rejected_naming([&] { forward_paged(p.query(), cache, missing); }, "options.value_scale", {});
        Options wrong = o;
        wrong.key_scale = k8.scale.view();
        wrong.key_scale->shape = {pages, Hkv * page};
        wrong.key_scale->strides = {};
        expect_rejected_naming([&] { forward_paged(p.query(), cache, wrong); }, "options.key_scale", {});
      }
}

TEST(PagedValidation, ValidCallIsAccepted) {
  PagedCall c = valid_paged_call();
  forward_paged(c.q.view(), c.cache, caller_buffers(c.out, c.lse, c.weights, false), c.options);
  EXPECT_FALSE(untouched(c.out));
  EXPECT_FALSE(untouched(c.lse));
}

TEST(PagedValidation, BadBlockTablesAndSeqLensAreRejected) {
  PagedCall c = valid_paged_call();
  c.cache.block_table[1] = 5;  // sequence 0's second page: only pages 0..4 exist
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.block_table[0] = -1;
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.block_table = {3, 1, 4};  // batch · blocks_per_sequence = 4 entries expected
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.block_table = {3, 1, 4, 0, 2};
  expect_paged_rejected(c, "block_table");
  c = valid_paged_call();
  c.cache.seq_lens = {9, 3};  // more than 2 blocks of 4
  expect_paged_rejected(c, "seq_lens");
  c = valid_paged_call();
  c.cache.seq_lens = {5, -1};
  expect_paged_rejected(c, "seq_lens");
  c = valid_paged_call();
  c.cache.seq_lens = {5};  // one per batch element expected
  expect_paged_rejected(c, "seq_lens");
}

TEST(PagedValidation, MaskWeightsAndMismatchedPagesAreRejected) {
  PagedCall c = valid_paged_call();
  c.options.mask = c.mask.view();
  expect_paged_rejected(c, "mask");
  c = valid_paged_call();
  expect_paged_rejected(c, "weights", true);
  Returns weights;
  weights.weights = true;
  expect_rejected_naming([&] { forward_paged(c.q.view(), c.cache, c.options, weights); }, "weights", {});
  const Tensor wrong_page_size(DType::float32, {5, 1, 3, 3}), wrong_pages(DType::float32, {4, 1, 4, 3}),
      wrong_heads(DType::float32, {5, 2, 4, 3}), wrong_dim(DType::float32, {5, 1, 4, 5});
  for (const Tensor* value_pages : {&wrong_page_size, &wrong_pages, &wrong_heads}) {
    c = valid_paged_call();
    c.cache.value_pages = value_pages->view();
    expect_paged_rejected(c, "value_pages");
  }
  c = valid_paged_call();
  c.cache.key_pages = wrong_dim.view();  // E = 5, the query's is 4
  expect_paged_rejected(c, "key_pages");
  c = valid_paged_call();
  const Tensor key64 = convert(c.key_pages, DType::float64);
  c.cache.key_pages = key64.view();
  expect_paged_rejected(c, "key_pages");
  c = valid_paged_call();
  const Tensor slopes(DType::float32, {3, 2});  // (batch, Hq) with batch 2 expected
  c.options.alibi_slopes = slopes.view();
  expect_paged_rejected(c, "alibi_slopes");
}
}  // namespace
}  // namespace sdpa::testing
