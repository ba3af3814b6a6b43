// Memory running out, made to happen without a hook in the library: a cap on the
// process's own address space (RLIMIT_AS) a little above what it maps now. Not under
// AddressSanitizer, which reserves terabytes of address space (callers skip there).
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace sdpa::testing {

// Caps RLIMIT_AS at the current mapping (/proc/self/status's VmSize) plus `margin_bytes`
// until destroyed, then restores the limit it found.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(std::uint64_t margin_bytes);
  ~AddressSpaceCap();
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;
  // Whether the cap is in force (false: VmSize not found, or setrlimit refused).
  bool active() const { return active_; }

 private:
  rlimit before_{};
  bool active_ = false;
};

}  // namespace sdpa::testing
