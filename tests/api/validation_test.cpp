// Every bad input of DESIGN.md §1 is rejected with an error naming the argument, the
// expected and the actual value, and nothing is written: shapes, dtypes, overlaps and
// every option, the score modifiers (window, softcap, ALiBi, alignment) included, by
// forward() and backward().
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "testing/helpers.h"
#include "testing/rejection.h"

namespace sdpa::testing {
namespace {

using Call = ValidCall;

Call valid_call() { return {}; }

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Calls forward with `c`, expects sdpa::Error naming `argument` with every fragment of
// `says` in its message, and checks that no output element changed.
void expect_rejected(const Call& c, const std::string& argument, std::initializer_list<const char*> says,
                     const ForwardOutputs* outputs = nullptr, ErrorKind kind = ErrorKind::value) {
  try {
    forward(c.q.view(), c.k.view(), c.v.view(), outputs ? *outputs : c.outputs(), c.options);
    ADD_FAILURE() << "accepted; expected an error naming " << argument;
  } catch (const Error& e) {
    expect_error_names(e, argument, says, kind);
  }
  EXPECT_TRUE(untouched(c.out) && untouched(c.weights) && untouched(c.lse)) << "an output was written";
}

TEST(Validation, ValidCallIsAccepted) {
  Call c = valid_call();
  forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);
  EXPECT_FALSE(untouched(c.out));
}

TEST(Validation, RankMismatch) {
  Call c = valid_call();
  c.k = Tensor(DType::float32, {2, 6, 8});
  expect_rejected(c, "key", {"expected rank 4", "(2, 6, 8)"});
  c = valid_call();
  c.q = Tensor(DType::float32, {8});
  expect_rejected(c, "query", {"rank >= 2", "(8,)"});
}

TEST(Validation, ShapeMismatches) {
  Call c = valid_call();
  c.k = Tensor(DType::float32, {2, 2, 6, 7});
  expect_rejected(c, "key", {"E = 8", "got 7"});
  c = valid_call();
  c.v = Tensor(DType::float32, {2, 2, 5, 3});
  expect_rejected(c, "value", {"S = 6", "got 5"});
  c = valid_call();
  c.k = Tensor(DType::float32, {3, 2, 6, 8});
  expect_rejected(c, "key", {"batch dims (2,)", "got (3,)"});
  c = valid_call();
  c.v = Tensor(DType::float32, {2, 1, 6, 3});
  expect_rejected(c, "value", {"2 heads", "got 1"});
}

TEST(Validation, HeadCountsForGqa) {
  Call c = valid_call();
  c.k = Tensor(DType::float32, {2, 3, 6, 8});
  c.v = Tensor(DType::float32, {2, 3, 6, 3});
  expect_rejected(c, "key", {"dividing the query's 4", "got 3"});
  c.k = Tensor(DType::float32, {2, 0, 6, 8});  // Hkv = 0: an error, never a division by zero
  c.v = Tensor(DType::float32, {2, 0, 6, 3});
  expect_rejected(c, "key", {"at least one head"});
}

TEST(Validation, DtypeMismatches) {
  Call c = valid_call();
  c.k = convert(c.k, DType::float64);
  expect_rejected(c, "key", {"float32", "got float64"}, nullptr, ErrorKind::type);
  c = valid_call();
  c.q = convert(c.q, DType::boolean);
  expect_rejected(c, "query", {"got bool"}, nullptr, ErrorKind::type);
  c = valid_call();
  Tensor out64(DType::float64, {2, 4, 5, 3});
  const ForwardOutputs outputs{out64.view(), std::nullopt, std::nullopt};
  expect_rejected(c, "output", {"float32", "got float64"}, &outputs, ErrorKind::type);
}

TEST(Validation, MaskThatDoesNotBroadcast) {
  Call c = valid_call();
  Tensor mask(DType::boolean, {5, 5});
  c.options.mask = mask.view();
  expect_rejected(c, "mask", {"broadcastable to (2, 4, 5, 6)", "got (5, 5)"});
  Tensor too_many(DType::boolean, {1, 2, 4, 5, 6});
  c.options.mask = too_many.view();
  expect_rejected(c, "mask", {"at most 4 dims"});
}

TEST(Validation, DropoutOutsideUnitInterval) {
  for (double p : {-0.1, 1.0, 1.5, std::nan("")}) {
    Call c = valid_call();
    c.options.dropout_p = p;
    expect_rejected(c, "options.dropout_p", {"[0, 1)"});
  }
}

TEST(Validation, NonFiniteScale) {
  for (double s : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    Call c = valid_call();
    c.options.scale = s;
    expect_rejected(c, "options.scale", {"finite"});
  }
}

// Issue #12: 1e39 is finite in double but infinite in float32, the compute dtype of the
// float32/bfloat16/float16 kernels: every output came out NaN. The kernels fold log2(e)
// into the scale and the cap, so 2.4e38 overflowed too. float64 accepts both.
TEST(Validation, ScaleOrSoftcapNotFiniteInTheComputeDtype) {
  Call c = valid_call();
  c.options.scale = 1e39;
  expect_rejected(c, "options.scale", {"finite in float32", "float32 inputs", "1e+39"});
  c = valid_call();
  c.options.softcap = 2.4e38;
  expect_rejected(c, "options.softcap", {"finite in float32"});
  Tensor q64(DType::float64, {1, 2, 8}), k64(DType::float64, {1, 3, 8}), v64(DType::float64, {1, 3, 4});
  Options options;
  options.scale = 1e39;
  EXPECT_NO_THROW(forward(q64.view(), k64.view(), v64.view(), options));
}

// The largest accepted scale and cap compute: with q = 0 every score is 0 and the output
// is the mean of the values (a NaN here was the kernels' log2(e) overflowing).
TEST(Validation, LargestAcceptedScaleAndSoftcapGiveFiniteOutputs) {
  const Tensor q(DType::float32, {1, 2, 8});  // zeros
  Tensor k(DType::float32, {1, 3, 8}), v(DType::float32, {1, 3, 4});
  for (std::int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.25 * static_cast<double>(i % 7) - 0.5);
  for (std::int64_t i = 0; i < v.numel(); ++i) v.set(i, static_cast<double>(i));
  for (const auto& [scale, softcap] : {std::pair{-2.35e38, 0.0}, std::pair{1.0, 2.35e38}}) {
    Options options;
    options.scale = scale;
    options.softcap = softcap;
    const ForwardResult r = forward(q.view(), k.view(), v.view(), options);
    for (std::int64_t row = 0; row < 2; ++row)
      for (std::int64_t col = 0; col < 4; ++col) {
        const double mean = (v.get(col) + v.get(4 + col) + v.get(8 + col)) / 3.0;
        EXPECT_NEAR(r.output.get(row * 4 + col), mean, 1e-5) << "scale " << scale << " softcap " << softcap;
      }
  }
}

// Issue #12: OpenMP crashed starting 100000 threads.
TEST(Validation, ThreadCountBeyondTheLimit) {
  for (int threads : {-1, Options::kMaxThreads + 1, 100000}) {
    Call c = valid_call();
    c.options.num_threads = threads;
    expect_rejected(c, "options.num_threads", {"[0, 4096]"});
  }
}

TEST(Validation, NullData) {
  Call c = valid_call();
  TensorView null_key = c.k.view();
  null_key.data = nullptr;
  try {
    forward(c.q.view(), null_key, c.v.view(), c.outputs(), c.options);
    ADD_FAILURE() << "accepted a null key";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "key");
    EXPECT_NE(std::string(e.what()).find("null"), std::string::npos);
  }
  EXPECT_TRUE(untouched(c.out));
}

TEST(Validation, SizesWhoseProductOverflows) {
  Call c = valid_call();
  TensorView huge = c.q.view();
  huge.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40, 5, 8};
  try {
    forward(huge, c.k.view(), c.v.view(), c.outputs(), c.options);
    ADD_FAILURE() << "accepted an overflowing shape";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "query");
    EXPECT_NE(std::string(e.what()).find("overflow"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(untouched(c.out));
}

TEST(Validation, WrongOutputShapes) {
  Call c = valid_call();
  Tensor wrong(DType::float32, {2, 4, 5, 8});
  ForwardOutputs outputs = c.outputs();
  outputs.output = wrong.view();
  expect_rejected(c, "output", {"expected shape (2, 4, 5, 3)", "got (2, 4, 5, 8)"}, &outputs);
  outputs = c.outputs();
  outputs.weights = wrong.view();
  expect_rejected(c, "weights", {"expected shape (2, 4, 5, 6)"}, &outputs);
  Tensor lse64(DType::float64, {2, 4, 5});
  outputs = c.outputs();
  outputs.lse = lse64.view();
  expect_rejected(c, "lse", {"float32", "got float64"}, &outputs, ErrorKind::type);
}

TEST(Validation, OverlappingOutputs) {
  Call c = valid_call();
  ForwardOutputs outputs = c.outputs();
  outputs.output.strides = {0, 0, 3, 1};  // every (batch, head) writes the same rows
  expect_rejected(c, "output", {"do not overlap"}, &outputs);
  outputs = c.outputs();
  outputs.output.data = c.q.data();  // output on top of the query
  expect_rejected(c, "output", {"apart from the inputs"}, &outputs);
  outputs = c.outputs();
  TensorView lse_on_weights = c.weights.view();
  lse_on_weights.shape = {2, 4, 5};
  lse_on_weights.strides = {};
  outputs.lse = lse_on_weights;
  expect_rejected(c, "lse", {"apart from the other outputs"}, &outputs);
}

// An empty output writes nothing, so zero strides (NumPy's for empty arrays) are fine.
TEST(Validation, EmptyOutputWithZeroStridesIsAccepted) {
  float q[1], k[2], v[2], o[1];
  const ForwardOutputs outputs{{o, DType::float32, {0, 2}, {0, 0}}, std::nullopt, std::nullopt};
  EXPECT_NO_THROW(forward({q, DType::float32, {0, 2}, {}}, {k, DType::float32, {1, 2}, {}},
                          {v, DType::float32, {1, 2}, {}}, outputs));
}

TEST(Validation, StridesMustMatchRank) {
  Call c = valid_call();
  TensorView q = c.q.view();
  q.strides = {1, 1};
  try {
    forward(q, c.k.view(), c.v.view(), c.outputs(), c.options);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "query");
  }
  EXPECT_TRUE(untouched(c.out));
}

// ---- The score modifiers: window, softcap, ALiBi slopes, alignment ------------------

TEST(Validation, ModifiersAtTheirExtremesAreAccepted) {
  Call c = valid_call();
  c.options.window_left = 0, c.options.window_right = 0;
  c.options.softcap = 1e-3;
  const Tensor slopes(DType::float64, {2, 4});
  c.options.alibi_slopes = slopes.view();
  c.options.causal = Causal::bottom_right;
  c.options.alignment = Alignment::bottom_right;
  forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);
  EXPECT_FALSE(untouched(c.out));
}

TEST(Validation, WindowBelowMinusOne) {
  for (std::int64_t w : {-2, -100}) {
    Call c = valid_call();
    c.options.window_left = w;
    expect_rejected(c, "options.window_left", {});
    c = valid_call();
    c.options.window_right = w;
    expect_rejected(c, "options.window_right", {});
  }
}

TEST(Validation, SoftcapNegativeOrNotFinite) {
  for (double cap : {-1.0, -1e-9, kNaN, kInf, -kInf}) {
    Call c = valid_call();
    c.options.softcap = cap;
    expect_rejected(c, "options.softcap", {});
  }
}

// The slopes, a tensor like the mask, are named without "options.".
TEST(Validation, AlibiSlopesOfTheWrongShapeOrDtype) {
  for (const Shape& shape : {Shape{3}, Shape{5}, Shape{3, 4}, Shape{2, 3}, Shape{2, 4, 1}, Shape{}}) {
    Call c = valid_call();
    const Tensor slopes(DType::float32, shape);
    c.options.alibi_slopes = slopes.view();
    SCOPED_TRACE(shape.size());
    expect_rejected(c, "alibi_slopes", {});
  }
  for (DType dtype : {DType::boolean, DType::float16, DType::bfloat16}) {
    Call c = valid_call();
    const Tensor slopes(dtype, {4});
    c.options.alibi_slopes = slopes.view();
    SCOPED_TRACE(dtype_name(dtype));
    expect_rejected(c, "alibi_slopes", {}, nullptr, ErrorKind::type);
  }
  Call c = valid_call();
  TensorView null_slopes{nullptr, DType::float32, {4}, {}};
  c.options.alibi_slopes = null_slopes;
  expect_rejected(c, "alibi_slopes", {});
}

// The sinks are checked like the slopes (a per-head tensor, named without "options."),
// and each must be a logit the compute dtype holds: 1e39 is refused for float32 inputs
// (it would turn every row into NaN), accepted for float64; −inf (no sink) is accepted.
TEST(Validation, SinksOfTheWrongShapeDtypeOrRange) {
  for (const Shape& shape : {Shape{3}, Shape{5}, Shape{3, 4}, Shape{2, 4, 1}, Shape{}}) {
    Call c = valid_call();
    const Tensor sinks(DType::float32, shape);
    c.options.sinks = sinks.view();
    SCOPED_TRACE(shape.size());
    expect_rejected(c, "sinks", {});
  }
  for (DType dtype : {DType::boolean, DType::float16, DType::bfloat16}) {
    Call c = valid_call();
    const Tensor sinks(dtype, {4});
    c.options.sinks = sinks.view();
    expect_rejected(c, "sinks", {}, nullptr, ErrorKind::type);
  }
  Call c = valid_call();
  Tensor sinks(DType::float64, {2, 4});
  sinks.set(5, 1e39);
  c.options.sinks = sinks.view();
  expect_rejected(c, "sinks", {"finite in float32", "1e+39"});
  sinks.set(5, -kInf);
  forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);  // accepted
  sinks.set(5, 1e39);
  const Tensor q = convert(c.q, DType::float64), k = convert(c.k, DType::float64), v = convert(c.v, DType::float64);
  forward(q.view(), k.view(), v.view(), c.options);  // float64 holds it
}

TEST(Validation, AlignmentConflictingWithCausal) {
  Call c = valid_call();
  c.options.causal = Causal::top_left;
  c.options.alignment = Alignment::bottom_right;
  expect_rejected(c, "options.alignment", {});
  c = valid_call();
  c.options.causal = Causal::bottom_right;
  c.options.alignment = Alignment::top_left;
  expect_rejected(c, "options.alignment", {});
}

// int8 K/V (quantized caches): the scale must come with an int8 tensor and only with
// one, float32, of the tensor's shape without its last dim; int8 queries and masks are
// refused; the valid form is accepted.
TEST(Validation, Int8KeysAndValuesAndTheirScales) {
  Call c = valid_call();  // K (2, 2, 6, 8), V (2, 2, 6, 3)
  const Tensor k_scale(DType::float32, {2, 2, 6}), v_scale(DType::float32, {2, 2, 6});
  const Tensor k8 = convert(c.k, DType::int8), v8 = convert(c.v, DType::int8);
  c.k = k8;
  expect_rejected(c, "options.key_scale", {"int8 key", "got none"});
  c.options.key_scale = k_scale.view();
  forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);  // K int8, V float32: accepted
  c = valid_call();
  c.options.key_scale = k_scale.view();
  expect_rejected(c, "options.key_scale", {"no scale", "float32"});
  c = valid_call();
  c.v = v8;
  c.options.value_scale = k_scale.view();
  forward(c.q.view(), c.k.view(), c.v.view(), c.outputs(), c.options);  // V int8 alone: accepted
  const Tensor wrong_shape(DType::float32, {2, 2, 6, 1}), wrong_dtype(DType::float64, {2, 2, 6});
  c = valid_call();
  c.v = v8;
  c.options.value_scale = wrong_shape.view();
  expect_rejected(c, "options.value_scale", {"(2, 2, 6)", "got (2, 2, 6, 1)"});
  c.options.value_scale = wrong_dtype.view();
  expect_rejected(c, "options.value_scale", {"float32", "got float64"}, nullptr, ErrorKind::type);
  c = valid_call();
  c.q = convert(c.q, DType::int8);
  expect_rejected(c, "query", {"got int8"}, nullptr, ErrorKind::type);
  c = valid_call();
  const Tensor mask8(DType::int8, {6});
  c.options.mask = mask8.view();
  expect_rejected(c, "mask", {"got int8"}, nullptr, ErrorKind::type);
  // A scale overlapping an output is an input the output would damage.
  c = valid_call();
  c.k = k8;
  TensorView over_out = c.out.view();
  over_out.dtype = DType::float32;
  over_out.shape = {2, 2, 6};
  over_out.strides = {};
  c.options.key_scale = over_out;
  expect_rejected(c, "output", {});
}

// backward() validates the same options and writes no gradient.
TEST(Validation, BackwardRejectsTheSameModifiers) {
  Call c = valid_call();
  const ForwardResult fwd = forward(c.q.view(), c.k.view(), c.v.view(), c.options, Returns{false, true});
  std::mt19937_64 rng(3);
  const Tensor dout = random_tensor(DType::float32, {2, 4, 5, 3}, rng);
  Tensor dq(DType::float32, {2, 4, 5, 8}), dk(DType::float32, {2, 2, 6, 8}), dv(DType::float32, {2, 2, 6, 3});
  const Tensor bad_slopes(DType::boolean, {4});
  for (int n = 0; n < 4; ++n) {
    Options o;
    std::string argument;
    if (n == 0) o.window_left = -3, argument = "options.window_left";
    if (n == 1) o.softcap = kNaN, argument = "options.softcap";
    if (n == 2) o.alibi_slopes = bad_slopes.view(), argument = "alibi_slopes";
    if (n == 3) o.causal = Causal::top_left, o.alignment = Alignment::bottom_right, argument = "options.alignment";
    fill_with_sentinel({&dq, &dk, &dv});
    expect_rejected_naming(
        [&] {
          backward(BackwardInputs{c.q.view(), c.k.view(), c.v.view(), fwd.output.view(), fwd.lse.view(), dout.view()},
                   BackwardOutputs{dq.view(), dk.view(), dv.view(), std::nullopt}, o);
        },
        argument, {&dq, &dk, &dv});
  }
}

}  // namespace
}  // namespace sdpa::testing
