#include "testing/address_space.h"

#include <fstream>
#include <string>

namespace sdpa::testing {

AddressSpaceCap::AddressSpaceCap(std::uint64_t margin_bytes) {
  std::ifstream status("/proc/self/status");
  std::string line;
  std::uint64_t kib = 0;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) kib = std::stoull(line.substr(7));
  if (kib == 0 || getrlimit(RLIMIT_AS, &before_) != 0) return;
  rlimit tight = before_;
  tight.rlim_cur = (kib << 10) + margin_bytes;
  active_ = setrlimit(RLIMIT_AS, &tight) == 0;
}

AddressSpaceCap::~AddressSpaceCap() {
  if (active_) setrlimit(RLIMIT_AS, &before_);
}

}  // namespace sdpa::testing
