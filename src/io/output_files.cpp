#include "io/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <random>
#include <system_error>

#include "io/file.h"
#include "sdpa/error.h"

namespace sdpa::io {
namespace {

[[noreturn]] void fail(const std::string& argument, const std::string& message) {
  throw Error(ErrorKind::value, argument, message);
}

std::string quoted(const std::string& path) { return quote_untrusted(path, 200); }

std::string system_error_text() { return std::strerror(errno); }

// /dev/stdout and its kin name a file descriptor the caller set up (a pipe, a terminal,
// a file opened by the shell's redirection): written directly, never replaced.
bool names_file_descriptor(const std::string& path) {
  for (const char* prefix : {"/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/"}) {
    if (path.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::string parent_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A path that does not exist yet may still be a dangling symlink (o.npy -> new.npy):
// the file is created where the link points, as `cp` does, and the link stays.
std::string follow_dangling_links(const std::string& argument, const std::string& path) {
  std::string target = path;
  for (int hop = 0; hop < 40; ++hop) {  // 40: the kernel's own limit (MAXSYMLINKS)
    struct stat st;
    if (::lstat(target.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return target;
    std::string link(PATH_MAX, '\0');
    const ssize_t size = ::readlink(target.c_str(), link.data(), link.size());
    if (size < 0) fail(argument, "expected a resolvable path, got " + quoted(path) + ": " + system_error_text());
    link.resize(static_cast<std::size_t>(size));
    target = link.front() == '/' ? link : parent_of(target) + "/" + link;
  }
  fail(argument, "expected a path, got " + quoted(path) + ": too many levels of symbolic links");
}

std::string real_path(const std::string& argument, const std::string& path, const std::string& given) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    fail(argument, "expected a path in an existing directory, got " + quoted(given) + ": " + system_error_text());
  }
  std::string result(resolved);
  std::free(resolved);
  return result;
}

void require_writable_directory(const std::string& argument, const std::string& directory, const std::string& given) {
  struct stat st;
  if (::stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    fail(argument, "expected a path in an existing directory, got " + quoted(given));
  }
  if (::access(directory.c_str(), W_OK | X_OK) != 0) {
    fail(argument, "expected a path in a writable directory, got " + quoted(given) + ": " + system_error_text());
  }
}

void write_fully(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw std::system_error(errno != 0 ? errno : EIO, std::generic_category());
    bytes.remove_prefix(static_cast<std::size_t>(written));
  }
}

// A new file in `directory` whose name no one could have prepared: O_CREAT | O_EXCL
// never opens an existing file or follows a symlink planted at the name (the attack on a
// predictable "<out>.partial"). As mkstemp, but created with mode 0666 so that the
// process's umask applies to a new output as it does for any file the user creates.
int create_temporary(const std::string& directory, const std::string& name, std::string& temporary_path) {
  std::random_device entropy;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(entropy()));
    temporary_path = directory + "/." + name + "." + suffix + ".partial";
    const int fd = ::open(temporary_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

// The temporaries not yet renamed are removed however write() ends.
struct Temporaries {
  std::vector<std::string> paths;
  ~Temporaries() {
    for (const std::string& path : paths) {
      if (!path.empty()) ::unlink(path.c_str());
    }
  }
};

}  // namespace

void OutputFiles::add(const std::string& argument, const std::string& path) {
  if (path.empty()) fail(argument, "expected a file path, got an empty one");
  Destination d;
  d.argument = argument;
  d.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(argument, "expected a file, got a directory: " + quoted(path));
    d.exists = true;
    d.device = st.st_dev;
    d.inode = st.st_ino;
    d.mode = st.st_mode & 07777;
    d.direct = !S_ISREG(st.st_mode) || names_file_descriptor(path);
    if (!d.direct) {
      d.resolved_path = real_path(argument, path, path);
      require_writable_directory(argument, parent_of(d.resolved_path), path);
      if (::access(d.resolved_path.c_str(), W_OK) != 0) {
        fail(argument, "expected a writable file, got " + quoted(path) + ": " + system_error_text());
      }
    }
  } else if (errno == ENOENT) {
    const std::string target = follow_dangling_links(argument, path);
    const std::string name = name_of(target);
    if (name.empty() || name == "." || name == "..") {
      fail(argument, "expected a file, got a directory: " + quoted(path));
    }
    const std::string directory = real_path(argument, parent_of(target), path);
    require_writable_directory(argument, directory, path);
    d.resolved_path = (directory == "/" ? "" : directory) + "/" + name;
  } else {
    fail(argument, "expected a writable path, got " + quoted(path) + ": " + system_error_text());
  }

  for (const Destination& earlier : destinations_) {
    const bool same_file = d.exists && earlier.exists ? d.device == earlier.device && d.inode == earlier.inode
                                                      : !d.direct && d.resolved_path == earlier.resolved_path;
    if (same_file) {
      fail(argument, "expected a file different from " + earlier.argument + "'s, got " + quoted(path) +
                         ", the same file as " + quoted(earlier.path));
    }
  }
  destinations_.push_back(std::move(d));
}

void OutputFiles::write(const std::vector<std::string_view>& contents) const {
  if (contents.size() != destinations_.size()) {
    fail("contents", "expected " + std::to_string(destinations_.size()) + " files' contents, got " +
                         std::to_string(contents.size()));
  }
  const auto write_error = [](const Destination& d, const std::string& what, int error) {
    fail(d.argument, "expected to write " + quoted(d.path) + ", got an error " + what + ": " + std::strerror(error));
  };

  // 1. Every regular destination into a temporary of its own directory, flushed to disk
  //    before the rename so that a crash cannot leave an empty file under the old name.
  Temporaries temporaries;
  temporaries.paths.resize(destinations_.size());
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    const Destination& d = destinations_[i];
    if (d.direct) continue;
    const int fd = create_temporary(parent_of(d.resolved_path), name_of(d.resolved_path), temporaries.paths[i]);
    if (fd < 0) {
      const int error = errno;
      temporaries.paths[i].clear();
      write_error(d, "creating a temporary file", error);
    }
    try {
      if (d.exists && ::fchmod(fd, d.mode) != 0) throw std::system_error(errno, std::generic_category());
      write_fully(fd, contents[i]);
      if (::fsync(fd) != 0) throw std::system_error(errno, std::generic_category());
    } catch (const std::system_error& e) {
      ::close(fd);
      write_error(d, "writing", e.code().value());
    }
    if (::close(fd) != 0) write_error(d, "closing", errno);
  }

  // 2. Devices, FIFOs and file descriptors, opened as they are (a FIFO waits for its
  //    reader, as it does for `cp`).
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    const Destination& d = destinations_[i];
    if (!d.direct) continue;
    const int fd = ::open(d.path.c_str(), O_WRONLY | O_TRUNC | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) write_error(d, "opening", errno);
    try {
      write_fully(fd, contents[i]);
    } catch (const std::system_error& e) {
      ::close(fd);
      write_error(d, "writing", e.code().value());
    }
    if (::close(fd) != 0) write_error(d, "closing", errno);
  }

  // 3. The renames, last: each replaces its destination atomically.
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    const Destination& d = destinations_[i];
    if (d.direct) continue;
    if (::rename(temporaries.paths[i].c_str(), d.resolved_path.c_str()) != 0) write_error(d, "renaming", errno);
    temporaries.paths[i].clear();
  }
}

void write_file(const std::string& path, std::string_view contents) {
  OutputFiles output;
  output.add(path, path);
  output.write({contents});
}

}  // namespace sdpa::io
