// Fuzzes the .npy parser: any input must either parse into a consistent tensor or end
// in sdpa::Error. Any other exception (std::bad_alloc from a size taken on trust,
// std::length_error, ...), a sanitizer report, or a crash is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/npy.h"
#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace {
// Keeps the element reads below from being optimised away.
volatile double sink;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const sdpa::Tensor tensor = sdpa::io::parse_npy(data, size, "fuzz.npy");
    // The tensor must own exactly the bytes its shape says; a mismatch would turn into
    // out-of-bounds access in every consumer.
    const auto expected = static_cast<std::size_t>(tensor.numel()) * sdpa::dtype_size(tensor.dtype());
    if (tensor.nbytes() != expected || tensor.nbytes() > size) std::abort();
    // Touch every element so that ASan sees the whole buffer and a bool other than 0/1
    // or an uninitialised read would surface.
    double sum = 0;
    for (std::int64_t i = 0; i < tensor.numel(); ++i) sum += tensor.get(i);
    sink = sum;
  } catch (const sdpa::Error&) {
    // Rejecting a malformed file is the expected outcome.
  }
  return 0;
}
