#include "io/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <cerrno>
#include <charconv>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Reads errno before anything else can clobber it (the message's other pieces allocate).
[[noreturn]] void fail_with_errno(const std::string& argument, const std::string& expected, const std::string& path) {
  const int error = errno;
  fail(argument, expected + ", got " + quoted(path) + ": " + std::strerror(error));
}

// /dev/stdout and its kin name a file descriptor the caller set up (a pipe, a terminal,
// a socket, a file opened by the shell's `>` or `>>`): written through that descriptor,
// never reopened (a reopen would truncate a `>>` log, start at offset 0 under what the
// process prints next, and fail on a socket) and never replaced. -1 for other paths.
int file_descriptor_named(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  for (const std::string prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    if (path.rfind(prefix, 0) != 0) continue;
    const std::string digits = path.substr(prefix.size());
    int fd = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), fd);
    return error == std::errc() && end == digits.data() + digits.size() && fd >= 0 ? fd : -1;
  }
  return -1;
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
    if (size < 0) fail_with_errno(argument, "expected a resolvable path", path);
    link.resize(static_cast<std::size_t>(size));
    target = link.front() == '/' ? link : parent_of(target) + "/" + link;
  }
  fail(argument, "expected a path, got " + quoted(path) + ": too many levels of symbolic links");
}

std::string real_path(const std::string& argument, const std::string& path, const std::string& given) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) fail_with_errno(argument, "expected a path in an existing directory", given);
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
    fail_with_errno(argument, "expected a path in a writable directory", given);
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
// predictable "<out>.partial"). As mkstemp, but created with `mode` (0666 for a new
// output, so that the umask applies as for any file the user creates; the replaced
// file's own bits otherwise, so that it is never more readable than the file it
// replaces, not even for a moment). The name is cut so that the temporary's stays
// within NAME_MAX (255) whenever the output's does.
int create_temporary(const std::string& directory, const std::string& name, mode_t mode, std::string& temporary_path) {
  std::random_device entropy;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%08x", static_cast<unsigned>(entropy()));
    temporary_path = directory + "/." + name.substr(0, 200) + "." + suffix + ".partial";
    const int fd = ::open(temporary_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

// The temporaries not yet renamed are removed, and the destinations this call opened
// are closed, however write() ends.
struct OpenFiles {
  std::vector<std::string> temporaries;
  std::vector<int> opened;
  ~OpenFiles() {
    for (const std::string& path : temporaries) {
      if (!path.empty()) ::unlink(path.c_str());
    }
    for (int fd : opened) {
      if (fd >= 0) ::close(fd);
    }
  }
};

// A reader that goes away (a FIFO's, a pipe's) makes write() fail with EPIPE, reported
// as any failed write, instead of killing the process with SIGPIPE. Blocked in this
// thread only while direct destinations are written; a SIGPIPE raised meanwhile is
// consumed before the mask is restored.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~SigpipeBlocked() {
    if (!sigismember(&previous_, SIGPIPE)) {
      sigset_t pending;
      sigpending(&pending);
      const timespec now{0, 0};
      if (sigismember(&pending, SIGPIPE)) sigtimedwait(&pipe_, nullptr, &now);
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_, previous_;
};

}  // namespace

// A replacement keeps the old file's permission bits, without setuid/setgid (as `cp`
// without -p); a new file gets 0666, which the umask then narrows.
unsigned OutputFiles::replacement_mode(const Destination& d) { return d.exists ? (d.mode & 01777) : 0666; }

void OutputFiles::add(const std::string& argument, const std::string& path) {
  if (path.empty()) fail(argument, "expected a file path, got an empty one");
  Destination d;
  d.argument = argument;
  d.path = path;
  d.descriptor = file_descriptor_named(path);
  struct stat st;
  const int status = d.descriptor >= 0 ? ::fstat(d.descriptor, &st) : ::stat(path.c_str(), &st);
  if (d.descriptor >= 0 && status != 0) fail_with_errno(argument, "expected an open file descriptor", path);
  if (status == 0) {
    if (S_ISDIR(st.st_mode)) fail(argument, "expected a file, got a directory: " + quoted(path));
    d.exists = true;
    d.device = st.st_dev;
    d.inode = st.st_ino;
    d.mode = st.st_mode & 07777;
    d.direct = !S_ISREG(st.st_mode) || d.descriptor >= 0;
    if (!d.direct) {
      d.resolved_path = real_path(argument, path, path);
      require_writable_directory(argument, parent_of(d.resolved_path), path);
      if (::access(d.resolved_path.c_str(), W_OK) != 0) fail_with_errno(argument, "expected a writable file", path);
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
    fail_with_errno(argument, "expected a writable path", path);
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
  OpenFiles files;
  files.temporaries.resize(destinations_.size());
  files.opened.assign(destinations_.size(), -1);

  // 1. Devices and FIFOs opened as they are, before any temporary exists: a FIFO waits
  //    for its reader (as for `cp`), and a run killed while it waits leaves nothing.
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    const Destination& d = destinations_[i];
    if (!d.direct || d.descriptor >= 0) continue;
    files.opened[i] = ::open(d.path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (files.opened[i] < 0) write_error(d, "opening", errno);
  }

  // 2. Every regular destination into a temporary of its own directory, flushed to disk
  //    before the rename so that a crash cannot leave an empty file under the old name,
  //    with the permission bits of replacement_mode.
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    const Destination& d = destinations_[i];
    if (d.direct) continue;
    const int fd = create_temporary_beside(target_of(d), files.temporaries[i]);
    if (fd < 0) {
      const int error = errno;
      files.temporaries[i].clear();
      write_error(d, "creating a temporary file", error);
    }
    try {
      write_fully(fd, contents[i]);
      if (::fsync(fd) != 0) throw std::system_error(errno, std::generic_category());
    } catch (const std::system_error& e) {
      ::close(fd);
      write_error(d, "writing", e.code().value());
    }
    if (::close(fd) != 0) write_error(d, "closing", errno);
  }

  // 3. The direct destinations' bytes: devices and FIFOs through what step 1 opened,
  //    file descriptors through themselves (keeping O_APPEND and the shared offset).
  {
    const SigpipeBlocked no_sigpipe;
    for (std::size_t i = 0; i < destinations_.size(); ++i) {
      const Destination& d = destinations_[i];
      if (!d.direct) continue;
      try {
        write_fully(d.descriptor >= 0 ? d.descriptor : files.opened[i], contents[i]);
      } catch (const std::system_error& e) {
        write_error(d, "writing", e.code().value());
      }
    }
  }

  // 4. The renames, last: each replaces its destination atomically. A rename fails only
  //    if the folder changed under the command since step 2; the renames done before it
  //    then stay done (the one gap in all-or-nothing).
  for (std::size_t i = 0; i < destinations_.size(); ++i) {
    const Destination& d = destinations_[i];
    if (d.direct) continue;
    if (::rename(files.temporaries[i].c_str(), d.resolved_path.c_str()) != 0) write_error(d, "renaming", errno);
    files.temporaries[i].clear();
  }
}

OutputFiles::Target OutputFiles::target_of(const Destination& d) {
  return {d.argument, d.path, d.resolved_path, d.direct, d.exists, replacement_mode(d)};
}

std::vector<OutputFiles::Target> OutputFiles::targets() const {
  std::vector<Target> out;
  for (const Destination& d : destinations_) out.push_back(target_of(d));
  return out;
}

int create_temporary_beside(const OutputFiles::Target& target, std::string& temporary_path) {
  const int fd = create_temporary(parent_of(target.resolved_path), name_of(target.resolved_path), target.mode & 0777,
                                  temporary_path);
  // An existing file's bits exactly (the umask narrowed the open's), the sticky bit too.
  if (fd >= 0 && target.exists && ::fchmod(fd, target.mode) != 0) {
    const int error = errno;
    ::close(fd);
    ::unlink(temporary_path.c_str());
    errno = error;
    return -1;
  }
  return fd;
}

void write_file(const std::string& path, std::string_view contents) {
  OutputFiles output;
  output.add(path, path);
  output.write({contents});
}

}  // namespace sdpa::io
