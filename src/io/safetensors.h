// safetensors files (huggingface/safetensors): the format PyTorch users exchange model
// weights in. The reader is hardened like the .npy one: every malformed, truncated or
// oversized input ends in sdpa::Error naming the file, never a crash, an out-of-bounds
// read or an allocation sized by an unchecked header field.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::io {

// The contents of one file. Tensors of a dtype sdpa has (F16, BF16, F32, F64, BOOL) are
// loaded; entries of any other valid safetensors dtype (integers, FP8) are checked like
// the rest and listed in `skipped` (name -> dtype string), so a model file with, say,
// int64 position ids still loads and a caller asking for such a tensor gets a clear
// message instead of "not found".
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" (string -> string)
  std::map<std::string, std::string> skipped;
};

// Parses a whole file held in memory. `name` goes into error messages (a path, usually).
// Checked, as the reference implementation does: the 8-byte header length against the
// file size (and at most 100 MB), the header is a JSON object whose entries have exactly
// "dtype", "shape" and "data_offsets", no duplicate keys, shape x dtype size equals the
// entry's byte range, and the ranges tile the data buffer exactly (no gap, no overlap, no
// trailing bytes).
SafetensorsFile parse_safetensors(const void* bytes, std::size_t size, const std::string& name);

// Reads a file from disk; throws sdpa::Error naming `path`.
SafetensorsFile read_safetensors(const std::string& path);

// Serialises `tensors` in the given order (names must be unique and not "__metadata__"),
// with the header padded with spaces to a multiple of 8 bytes as the reference writer
// does, so the data of every tensor starts 8-byte aligned.
std::string serialize_safetensors(const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// Writes serialize_safetensors(...) to `path`; throws sdpa::Error naming it on failure.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace sdpa::io
