// Reading a whole file into memory, for the readers that parse from a buffer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sdpa::io {

// The bytes of the file at `path`. A file that cannot be opened or read in full is an
// sdpa::Error naming the path, expecting "a readable <description> file" (".npy", ...).
std::vector<char> read_file(const std::string& path, const std::string& description);

// Text taken from a file, quoted for an error message: at most `limit` characters (then
// "..."), non-printable bytes and backslashes escaped as \xNN, so that a hostile header
// can neither flood nor garble the message.
std::string quote_untrusted(std::string_view text, std::size_t limit);

}  // namespace sdpa::io
