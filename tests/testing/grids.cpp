#include "testing/grids.h"

#include <utility>

namespace sdpa::testing {

std::vector<Case> awkward_shape_cases(int every, int phase) {
  const std::int64_t dims[] = {1, 8, 40, 64, 80, 96, 111, 128, 256};
  std::vector<Case> cases;
  for_sampled_awkward_shapes(dims, every, phase, [&](std::int64_t L, std::int64_t S, std::int64_t E, int n) {
    Case c;
    c.batch = {1};
    c.heads_q = c.heads_kv = 1;
    c.L = L, c.S = S, c.E = E, c.Ev = (n % 2) ? E : dims[n % 9];
    cases.push_back(c);
  });
  return cases;
}

std::vector<Case> long_sequence_cases(std::initializer_list<std::pair<std::int64_t, std::int64_t>> lengths) {
  std::vector<Case> cases;
  for (auto [L, S] : lengths) {
    Case c;
    c.batch = {1};
    c.heads_q = c.heads_kv = 1;
    c.L = L, c.S = S, c.E = 64, c.Ev = 40;
    cases.push_back(c);
    c.causal = Causal::bottom_right;
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> gqa_ratio_cases() {
  std::vector<Case> cases;
  for (std::int64_t ratio : {1, 2, 5, 27})
    for (std::int64_t heads_kv : {1, 2}) {
      Case c;
      c.heads_kv = heads_kv;
      c.heads_q = heads_kv * ratio;
      c.L = 9, c.S = 13, c.E = 16, c.Ev = 24;
      c.mask = Case::Mask::boolean;
      cases.push_back(c);
    }
  return cases;
}

std::vector<Case> mask_broadcast_cases() {
  const Shape shapes[] = {{7},       {1},          {5, 7},       {5, 1},       {1, 7},       {3, 1, 7},   {3, 5, 7},
                          {1, 5, 7}, {2, 1, 1, 7}, {2, 3, 5, 7}, {1, 1, 5, 7}, {2, 1, 5, 1}, {1, 3, 1, 1}};
  std::vector<Case> cases;
  for (const Shape& shape : shapes)
    for (auto kind : {Case::Mask::boolean, Case::Mask::additive}) {
      Case c;
      c.heads_q = c.heads_kv = 3;
      c.L = 5, c.S = 7;
      c.mask = kind;
      c.mask_shape = shape;
      cases.push_back(c);
    }
  return cases;
}

std::vector<Case> causal_alignment_cases() {
  std::vector<Case> cases;
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{17, 17}, {5, 70}, {70, 5}, {1, 129}, {129, 1}, {200, 150}})
    for (Causal causal : {Causal::top_left, Causal::bottom_right})
      for (auto mask : {Case::Mask::none, Case::Mask::boolean, Case::Mask::additive}) {
        Case c;
        c.L = L, c.S = S, c.causal = causal, c.mask = mask;
        cases.push_back(c);
      }
  return cases;
}

std::vector<Case> dtype_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::float64, DType::float32, DType::bfloat16, DType::float16})
    for (auto mask : {Case::Mask::none, Case::Mask::boolean, Case::Mask::additive})
      for (Causal causal : {Causal::none, Causal::top_left}) {
        Case c;
        c.dtype = dtype;
        c.L = 65, c.S = 129, c.E = 64, c.Ev = 40;
        c.mask = mask, c.causal = causal;
        cases.push_back(c);
      }
  return cases;
}

std::vector<Case> interleaved_cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float64}) {
    Case c;
    c.dtype = dtype;
    c.interleaved = true;
    c.heads_q = 4, c.heads_kv = 2, c.L = 33, c.S = 65, c.E = 40, c.Ev = 40;
    c.causal = Causal::top_left;
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> scale_cases() {
  std::vector<Case> cases;
  for (double scale : {-0.7, 0.0, 3.0}) {
    Case c;
    c.scale = scale;
    c.mask = Case::Mask::additive;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace sdpa::testing
