// The one exception type sdpa throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace sdpa {

// What kind of mistake: a wrong dtype (Python maps it to TypeError) or a wrong shape,
// size or value (ValueError).
enum class ErrorKind { type, value };

// Thrown before any work is done: no output buffer has been written when it arrives.
// what() reads "<argument>: <what was expected>, got <what was given>".
class Error : public std::invalid_argument {
 public:
  Error(ErrorKind kind, std::string argument, std::string message)
      : std::invalid_argument(argument + ": " + message),
        kind_(kind),
        argument_(std::move(argument)),
        message_(std::move(message)) {}

  ErrorKind kind() const { return kind_; }
  // The name of the argument at fault ("query", "attn_mask", "options.dropout_p", ...).
  const std::string& argument() const { return argument_; }
  // what() without the argument: "<what was expected>, got <what was given>". A front end
  // that names the argument its own way (Python's keyword, the CLI's flag) puts its name
  // before it.
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  std::string argument_;
  std::string message_;
};

}  // namespace sdpa
