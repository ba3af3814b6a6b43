#include "testing/rejection.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>

#include "testing/helpers.h"

namespace sdpa::testing {

void fill_with_sentinel(std::initializer_list<Tensor*> tensors) {
  for (Tensor* t : tensors)
    for (std::int64_t i = 0; i < t->numel(); ++i) t->set(i, kSentinel);
}

ValidCall::ValidCall() {
  std::mt19937_64 rng(1);
  q = random_tensor(DType::float32, {2, 4, 5, 8}, rng);
  k = random_tensor(DType::float32, {2, 2, 6, 8}, rng);
  v = random_tensor(DType::float32, {2, 2, 6, 3}, rng);
  out = Tensor(DType::float32, {2, 4, 5, 3});
  weights = Tensor(DType::float32, {2, 4, 5, 6});
  lse = Tensor(DType::float32, {2, 4, 5});
  fill_with_sentinel({&out, &weights, &lse});
}

bool untouched(const Tensor& tensor) {
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    if (tensor.get(i) != kSentinel) return false;
  return true;
}

void expect_error_names(const Error& error, const std::string& argument, std::initializer_list<const char*> says,
                        ErrorKind kind) {
  EXPECT_EQ(error.argument(), argument) << error.what();
  EXPECT_EQ(error.kind(), kind) << error.what();
  const std::string message = error.what();
  EXPECT_EQ(message.rfind(argument + ": ", 0), 0u) << message;
  for (const char* fragment : says) EXPECT_NE(message.find(fragment), std::string::npos) << message;
}

ForwardOutputs caller_buffers(const Tensor& out, const Tensor& lse, const Tensor& weights, bool with_weights) {
  return {out.view(), with_weights ? std::optional<TensorView>(weights.view()) : std::nullopt, lse.view()};
}

void expect_rejected_naming(const std::function<void()>& call, const std::string& names,
                            std::initializer_list<const Tensor*> outputs) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error naming " << names;
  } catch (const Error& e) {
    EXPECT_NE(e.argument().find(names), std::string::npos) << "argument() = " << e.argument() << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(e.argument() + ": ", 0), 0u) << e.what();
    EXPECT_EQ(std::string(e.what()), e.argument() + ": " + e.message());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than sdpa::Error: " << e.what();
  }
  for (const Tensor* t : outputs) EXPECT_TRUE(untouched(*t)) << "an output was written (" << names << ")";
}

}  // namespace sdpa::testing
