// backward() rejects every bad input with an error naming the argument, the expected
// and the actual value, and writes nothing (DESIGN.md §1, "Bad input").
#include <gtest/gtest.h>

#include <random>

#include "testing/helpers.h"
#include "testing/rejection.h"

namespace sdpa::testing {
namespace {

struct Call {
  Tensor q, k, v, out, lse, dout, mask;
  Tensor dq, dk, dv, dmask;
  Options options;
  BackwardInputs inputs() const { return {q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view()}; }
  BackwardOutputs outputs() const { return {dq.view(), dk.view(), dv.view(), dmask.view()}; }
};

Call valid_call() {
  std::mt19937_64 rng(1);
  Call c;
  c.q = random_tensor(DType::float32, {2, 4, 5, 8}, rng);
  c.k = random_tensor(DType::float32, {2, 2, 6, 8}, rng);
  c.v = random_tensor(DType::float32, {2, 2, 6, 3}, rng);
  c.mask = random_tensor(DType::float32, {5, 6}, rng);
  c.options.mask = c.mask.view();
  c.out = Tensor(DType::float32, {2, 4, 5, 3});
  c.lse = Tensor(DType::float32, {2, 4, 5});
  forward(c.q.view(), c.k.view(), c.v.view(), ForwardOutputs{c.out.view(), std::nullopt, c.lse.view()}, c.options);
  c.dout = random_tensor(DType::float32, {2, 4, 5, 3}, rng);
  c.dq = Tensor(DType::float32, {2, 4, 5, 8});
  c.dk = Tensor(DType::float32, {2, 2, 6, 8});
  c.dv = Tensor(DType::float32, {2, 2, 6, 3});
  c.dmask = Tensor(DType::float32, {5, 6});
  fill_with_sentinel({&c.dq, &c.dk, &c.dv, &c.dmask});
  return c;
}

void expect_rejected(const Call& c, const BackwardInputs& inputs, const BackwardOutputs& outputs,
                     const std::string& argument, std::initializer_list<const char*> says,
                     ErrorKind kind = ErrorKind::value) {
  try {
    backward(inputs, outputs, c.options);
    ADD_FAILURE() << "accepted; expected an error naming " << argument;
  } catch (const Error& e) {
    expect_error_names(e, argument, says, kind);
  }
  EXPECT_TRUE(untouched(c.dq) && untouched(c.dk) && untouched(c.dv) && untouched(c.dmask)) << "a gradient was written";
}

TEST(BackwardValidation, ValidCallIsAccepted) {
  Call c = valid_call();
  backward(c.inputs(), c.outputs(), c.options);
  EXPECT_FALSE(untouched(c.dq));
  EXPECT_FALSE(untouched(c.dmask));
}

TEST(BackwardValidation, ForwardResultsOfTheWrongShapeOrDtype) {
  Call c = valid_call();
  BackwardInputs in = c.inputs();
  const Tensor wrong(DType::float32, {2, 4, 5, 8});
  in.grad_output = wrong.view();
  expect_rejected(c, in, c.outputs(), "grad_output", {"expected shape (2, 4, 5, 3)", "got (2, 4, 5, 8)"});
  in = c.inputs();
  in.output = wrong.view();
  expect_rejected(c, in, c.outputs(), "output", {"expected shape (2, 4, 5, 3)"});
  in = c.inputs();
  const Tensor lse64(DType::float64, {2, 4, 5});
  in.lse = lse64.view();
  expect_rejected(c, in, c.outputs(), "lse", {"float32", "got float64"}, ErrorKind::type);
  in = c.inputs();
  const Tensor lse_short(DType::float32, {2, 4});
  in.lse = lse_short.view();
  expect_rejected(c, in, c.outputs(), "lse", {"expected shape (2, 4, 5)"});
  in = c.inputs();
  const Tensor dout16 = convert(c.dout, DType::float16);
  in.grad_output = dout16.view();
  expect_rejected(c, in, c.outputs(), "grad_output", {"float32", "got float16"}, ErrorKind::type);
}

TEST(BackwardValidation, InputChecksAreTheForwards) {
  Call c = valid_call();
  c.options.dropout_p = 1.0;
  expect_rejected(c, c.inputs(), c.outputs(), "options.dropout_p", {"[0, 1)"});
  c = valid_call();
  BackwardInputs in = c.inputs();
  const Tensor k3(DType::float32, {2, 3, 6, 8}), v3(DType::float32, {2, 3, 6, 3});
  in.key = k3.view();
  in.value = v3.view();
  expect_rejected(c, in, c.outputs(), "key", {"dividing the query's 4"});
}

TEST(BackwardValidation, GradientBuffersOfTheWrongShapeOrDtype) {
  Call c = valid_call();
  BackwardOutputs out = c.outputs();
  const Tensor wrong(DType::float32, {2, 4, 5, 3});
  out.grad_query = wrong.view();
  expect_rejected(c, c.inputs(), out, "grad_query", {"expected shape (2, 4, 5, 8)", "got (2, 4, 5, 3)"});
  out = c.outputs();
  const Tensor dk64(DType::float64, {2, 2, 6, 8});
  out.grad_key = dk64.view();
  expect_rejected(c, c.inputs(), out, "grad_key", {"float32", "got float64"}, ErrorKind::type);
  out = c.outputs();
  out.grad_value = c.dk.view();
  expect_rejected(c, c.inputs(), out, "grad_value", {"expected shape (2, 2, 6, 3)"});
  out = c.outputs();
  const Tensor full_mask_grad(DType::float32, {2, 4, 5, 6});
  out.grad_mask = full_mask_grad.view();
  expect_rejected(c, c.inputs(), out, "grad_mask", {"expected shape (5, 6)", "got (2, 4, 5, 6)"});
}

TEST(BackwardValidation, MaskGradientNeedsAFloatMask) {
  Call c = valid_call();
  c.options.mask.reset();
  expect_rejected(c, c.inputs(), c.outputs(), "grad_mask", {"no mask"});
  const Tensor bool_mask(DType::boolean, {5, 6});
  c.options.mask = bool_mask.view();
  expect_rejected(c, c.inputs(), c.outputs(), "grad_mask", {"bool mask"});
  // The allocating form reports the same.
  try {
    backward(c.inputs(), c.options, true);
    ADD_FAILURE() << "accepted a mask gradient for a bool mask";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "grad_mask");
  }
}

// grad_sinks only with sinks, their shape and dtype, and never over an input (the sinks
// themselves included): refused before any gradient is written.
TEST(BackwardValidation, SinkGradientNeedsSinksOfItsShapeAndDtype) {
  Call c = valid_call();
  Tensor dsinks(DType::float32, {4});
  BackwardOutputs out = c.outputs();
  out.grad_sinks = dsinks.view();
  expect_rejected(c, c.inputs(), out, "grad_sinks", {"no sinks"});
  Tensor sinks(DType::float32, {2, 4});
  for (std::int64_t n = 0; n < 8; ++n) sinks.set(n, 0.5);
  c.options.sinks = sinks.view();
  expect_rejected(c, c.inputs(), out, "grad_sinks", {"expected shape (2, 4)", "got (4,)"});
  const Tensor dsinks64(DType::float64, {2, 4});
  out.grad_sinks = dsinks64.view();
  expect_rejected(c, c.inputs(), out, "grad_sinks", {"float32", "got float64"}, ErrorKind::type);
  out.grad_sinks = sinks.view();  // the sinks are an input
  expect_rejected(c, c.inputs(), out, "grad_sinks", {"overlap"});
  const Tensor dsinks_ok(DType::float32, {2, 4});
  out.grad_sinks = dsinks_ok.view();
  backward(c.inputs(), out, c.options);  // accepted
  EXPECT_FALSE(untouched(c.dq));
}

TEST(BackwardValidation, OverlappingGradientBuffers) {
  Call c = valid_call();
  BackwardOutputs out = c.outputs();
  out.grad_query.strides = {0, 0, 8, 1};  // every (batch, head) writes the same rows
  expect_rejected(c, c.inputs(), out, "grad_query", {"do not overlap"});
  out = c.outputs();
  out.grad_key.data = c.k.data();  // dK on top of K
  expect_rejected(c, c.inputs(), out, "grad_key", {"apart from the inputs"});
  out = c.outputs();
  out.grad_value.data = c.dout.data();  // dV on top of dO (an input here)
  out.grad_value.shape = {2, 2, 6, 3};
  expect_rejected(c, c.inputs(), out, "grad_value", {"apart from the inputs"});
  out = c.outputs();
  TensorView dv_on_dk = c.dk.view();
  dv_on_dk.shape = {2, 2, 6, 3};
  dv_on_dk.strides = {};
  out.grad_value = dv_on_dk;
  expect_rejected(c, c.inputs(), out, "grad_value", {"apart from the other outputs"});
}

// Read-only tensors may have any strides: an expanded dO of ones (what autograd passes
// for out.sum()) is fine.
TEST(BackwardValidation, ReadOnlyTensorsMayBroadcast) {
  Call c = valid_call();
  BackwardInputs in = c.inputs();
  Tensor one(DType::float32, {1});
  one.set(0, 1.0);
  in.grad_output = one.view();
  in.grad_output.shape = {2, 4, 5, 3};
  in.grad_output.strides = {0, 0, 0, 0};
  backward(in, c.outputs(), c.options);
  EXPECT_FALSE(untouched(c.dq));
}

}  // namespace
}  // namespace sdpa::testing
