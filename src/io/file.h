// Reading a whole file into memory, for the readers that parse from a buffer.
#pragma once

#include <string>
#include <vector>

namespace sdpa::io {

// The bytes of the file at `path`. A file that cannot be opened or read in full is an
// sdpa::Error naming the path, expecting "a readable <description> file" (".npy", ...).
std::vector<char> read_file(const std::string& path, const std::string& description);

}  // namespace sdpa::io
