#include "sdpa/sdpa.h"

#include <omp.h>

#include <string>

#include "cpu/dispatch.h"

namespace sdpa {

const char* version() { return SDPA_VERSION; }

RuntimeInfo runtime_info() {
  __builtin_cpu_init();
  const struct {
    const char* name;
    bool present;
  } features[] = {
      {"sse4.2", __builtin_cpu_supports("sse4.2") != 0},     {"avx", __builtin_cpu_supports("avx") != 0},
      {"avx2", __builtin_cpu_supports("avx2") != 0},         {"fma", __builtin_cpu_supports("fma") != 0},
      {"avx512f", __builtin_cpu_supports("avx512f") != 0},
      {"avx512bw", __builtin_cpu_supports("avx512bw") != 0}, {"avx512vl", __builtin_cpu_supports("avx512vl") != 0},
      {"avx512bf16", __builtin_cpu_supports("avx512bf16") != 0},
  };
  RuntimeInfo info;
  info.version = version();
  for (const auto& feature : features)
    if (feature.present) {
      if (!info.cpu_features.empty()) info.cpu_features += ' ';
      info.cpu_features += feature.name;
    }
  info.cpu_kernel = detail::cpu_kernel_name();
  info.bfloat16_on_vdpbf16ps = detail::cpu_bfloat16_on_vdpbf16ps();
  info.max_threads = omp_get_max_threads();
  return info;
}

}  // namespace sdpa
