#include "testing/rejection.h"

#include <gtest/gtest.h>

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

}  // namespace sdpa::testing
