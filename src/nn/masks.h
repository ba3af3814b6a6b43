// Merging the layer's two masks (an attention mask in sdpa's polarity and a key-padding
// mask in torch.nn.MultiheadAttention's) into the one mask sdpa::forward takes.
#pragma once

#include <cstdint>
#include <optional>

#include "sdpa/tensor.h"

namespace sdpa::nn::detail {

struct MergedMask {
  Tensor storage;                  // owns the merged values when a merge was needed
  std::optional<TensorView> view;  // what to pass as Options::mask
};

// `mask` broadcastable to (B, Hq, L, S) (sdpa's polarity: bool true = attend, float
// added); `key_padding` (B, S), or (S) when `batched` is false (true = padding, float
// added). Validates both, naming "call.mask" / "call.key_padding_mask", then:
//   neither         -> no mask
//   mask only       -> mask, as it is
//   padding only    -> (B, 1, 1, S): bool attend = !padding, or the float values
//   both            -> (B, Hm, L, S), Hm = 1 unless the mask varies by head:
//                      bool AND of the two when both are bool, else the float sum with
//                      bool entries as 0 / −inf (what torch's MHA does)
MergedMask merge_masks(const std::optional<TensorView>& mask, const std::optional<TensorView>& key_padding,
                       std::int64_t batch, std::int64_t heads, std::int64_t queries, std::int64_t keys, bool batched);

}  // namespace sdpa::nn::detail
