// Writing a command's output files so that nothing is ever damaged (issue #12).
//
// What users expect of `cp`, `sort -o` and `curl -o`:
// - a regular file, or a path where nothing exists yet, is replaced atomically through a
//   uniquely named temporary created with O_EXCL in the destination's own directory
//   (mkstemp) and renamed over it: a reader sees the old file or the new one, never a
//   half-written one. A symlink is followed: its target is replaced, the link stays;
// - a destination that is not a regular file (a character device such as /dev/null, a
//   FIFO, a terminal) is opened and written directly: renaming over it would replace
//   the device node with a file. A path naming a file descriptor (/dev/stdout,
//   /dev/fd/N, /proc/self/fd/N) is written through that descriptor, not reopened;
// - the outputs of one command are all-or-nothing: every temporary and every direct
//   destination is written first, the renames come last, and a failure before them
//   removes the temporaries and leaves every pre-existing file as it was (a rename
//   failing because the folder changed under the command is the one gap);
// - two outputs that name the same file (after resolving `.`, `..`, symlinks and hard
//   links) are refused before any work, naming the second.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sdpa::io {

class OutputFiles {
 public:
  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  // Resolves `path` as an output and checks, before any work is done, that it can be
  // written: not a directory, in an existing directory, not the file of an earlier
  // output. Throws sdpa::Error naming `argument` (a flag such as "--out", or the path).
  void add(const std::string& argument, const std::string& path);

  // Writes contents[i] to the i-th added output, all-or-nothing as above. Throws
  // sdpa::Error naming the output's argument if a write fails; nothing pre-existing is
  // then changed (a device or FIFO already written to aside: what was sent is sent).
  void write(const std::vector<std::string_view>& contents) const;

  // Where add() found each output, for a writer that fills the file by pieces of its own
  // (the ring run: every rank writes its rows at their offsets, rank 0 renames).
  struct Target {
    std::string argument, path;
    std::string resolved_path;  // what a rename replaces (symlinks followed)
    bool direct = false;        // a device, FIFO, socket or file descriptor: no rename
    bool exists = false;
    unsigned mode = 0666;  // a replacement's permission bits (the old file's; 0666, less the umask, for a new one)
  };
  std::vector<Target> targets() const;

 private:
  struct Destination {
    std::string argument;
    std::string path;           // as given: what is opened when written directly
    std::string resolved_path;  // symlinks and `.`/`..` resolved: what a rename replaces
    bool direct = false;        // a device, FIFO, socket or file descriptor
    int descriptor = -1;        // the descriptor /dev/stdout, /dev/fd/N... name; -1 for others
    bool exists = false;
    unsigned long device = 0, inode = 0;  // the file's identity, when it exists
    unsigned mode = 0;                    // its permission bits, kept by the replacement
  };

  static unsigned replacement_mode(const Destination& d);
  static Target target_of(const Destination& d);

  std::vector<Destination> destinations_;
};

// A new file in the folder of `target`'s resolved path, to be renamed over it: created with
// O_EXCL under a name no one could have prepared, with the replacement's permission bits
// (the umask narrows a new file's, as for any file the user creates). Returns its
// descriptor and sets `temporary_path`, or returns -1 with errno set (nothing left behind).
int create_temporary_beside(const OutputFiles::Target& target, std::string& temporary_path);

// One output file: OutputFiles with a single entry, errors naming `path`.
void write_file(const std::string& path, std::string_view contents);

}  // namespace sdpa::io
