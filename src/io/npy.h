// NumPy .npy files (format versions 1.0, 2.0, 3.0): the way a NumPy or PyTorch user
// hands tensors to the CLI. The reader is hardened against hostile files: every
// malformed, truncated or oversized input ends in sdpa::Error, never a crash.
#pragma once

#include <cstddef>
#include <string>

#include "sdpa/tensor.h"

namespace sdpa::io {

// Parses a whole .npy file held in memory. Supported dtypes: float16, float32,
// float64 ('<f2', '<f4', '<f8', big-endian too) and bool ('|b1'); C or Fortran order
// (returned as packed row-major). `name` goes into error messages (a path, usually).
// Throws sdpa::Error(argument = name) on anything else.
Tensor parse_npy(const void* bytes, std::size_t size, const std::string& name);

// Reads a .npy file from disk; throws sdpa::Error naming `path`.
Tensor read_npy(const std::string& path);

// The bytes of `tensor` as a version 1.0 .npy file, little-endian, C order. bfloat16 has
// no NumPy dtype: it is written as float32. Throws sdpa::Error naming `name` for a tensor
// read_npy could not read back.
std::string encode_npy(const Tensor& tensor, const std::string& name);

// Writes encode_npy(tensor) to `path` as io::write_file does (output_files.h: a regular
// file replaced atomically, a device or FIFO written directly). Throws sdpa::Error
// naming `path` if it cannot be written; a failed write leaves the old file as it was.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace sdpa::io
