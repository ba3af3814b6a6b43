// Fuzzes the safetensors parser: any input must either parse into tensors whose byte
// counts match their shapes or end in sdpa::Error. Any other exception (std::bad_alloc
// from a size taken on trust, nlohmann's own exceptions leaking, ...), a sanitizer
// report, a stack overflow on nesting, or a crash is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/safetensors.h"
#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace {
volatile double sink;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const sdpa::io::SafetensorsFile file = sdpa::io::parse_safetensors(data, size, "fuzz.safetensors");
    std::size_t total = 0;
    for (const auto& [name, tensor] : file.tensors) {
      const auto expected = static_cast<std::size_t>(tensor.numel()) * sdpa::dtype_size(tensor.dtype());
      if (tensor.nbytes() != expected) std::abort();
      total += tensor.nbytes();
      double sum = 0;
      for (std::int64_t i = 0; i < tensor.numel(); ++i) sum += tensor.get(i);
      sink = sum;
    }
    // Every loaded byte came from the file.
    if (total > size) std::abort();
  } catch (const sdpa::Error&) {
    // Rejecting a malformed file is the expected outcome.
  }
  return 0;
}
