// io::OutputFiles (issue #12): outputs replace regular files atomically through a fresh
// temporary, follow symlinks, refuse two names for one file, and a failure part-way
// leaves every pre-existing file as it was and no temporary behind.
#include "io/output_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "sdpa/error.h"

namespace {

namespace fs = std::filesystem;
using sdpa::io::OutputFiles;
using sdpa::io::write_file;

// A fresh folder of the test's own under the system's temporary directory.
class OutputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "sdpa_output_files_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string contents(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void put(const std::string& file, const std::string& text) { std::ofstream(file, std::ios::binary) << text; }
  std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.insert(entry.path().filename().string());
    return names;
  }

  fs::path dir_;
};

// The message names the argument the caller gave, and says `expected`.
void expect_error(const std::function<void()>& call, const std::string& argument, const std::string& expected) {
  try {
    call();
    FAIL() << "no error; expected " << argument << ": " << expected;
  } catch (const sdpa::Error& e) {
    EXPECT_EQ(e.argument(), argument);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST_F(OutputFilesTest, NewAndExistingFilesGetTheContentsAndNoTemporaryStays) {
  put(path("old.bin"), "old");
  OutputFiles outputs;
  outputs.add("--out", path("old.bin"));
  outputs.add("--lse", path("new.bin"));
  outputs.write({"first", "second"});
  EXPECT_EQ(contents(path("old.bin")), "first");
  EXPECT_EQ(contents(path("new.bin")), "second");
  EXPECT_EQ(entries(), (std::set<std::string>{"old.bin", "new.bin"}));
}

TEST_F(OutputFilesTest, SymlinkIsFollowedAndKept) {
  put(path("target.bin"), "old");
  fs::create_symlink("target.bin", path("link.bin"));  // relative: resolved from the link's folder
  write_file(path("link.bin"), "new");
  EXPECT_TRUE(fs::is_symlink(path("link.bin")));
  EXPECT_EQ(contents(path("target.bin")), "new");
}

TEST_F(OutputFilesTest, FailureWhileWritingLeavesEveryFileAsItWas) {
  // The second output's folder disappears between the checks and the write: its
  // temporary cannot be created, after the first output's temporary was written.
  put(path("keep.bin"), "precious");
  fs::create_directory(path("gone"));
  OutputFiles outputs;
  outputs.add("--out", path("keep.bin"));
  outputs.add("--weights", path("gone/w.bin"));
  fs::remove(path("gone"));
  expect_error([&] { outputs.write({"new", "weights"}); }, "--weights", "temporary");
  EXPECT_EQ(contents(path("keep.bin")), "precious");
  EXPECT_EQ(entries(), (std::set<std::string>{"keep.bin"}));  // no temporary left
}

TEST_F(OutputFilesTest, TwoNamesForOneFileAreRefused) {
  put(path("a.bin"), "a");
  fs::create_hard_link(path("a.bin"), path("hard.bin"));
  fs::create_symlink(path("a.bin"), path("soft.bin"));
  fs::create_directory(path("sub"));
  for (const std::string& alias : {path("hard.bin"), path("soft.bin"), path("sub/../a.bin")}) {
    OutputFiles outputs;
    outputs.add("--out", path("a.bin"));
    expect_error([&] { outputs.add("--lse", alias); }, "--lse", "same file");
  }
  OutputFiles fresh;  // two spellings of a file that does not exist yet
  fresh.add("--out", path("n.bin"));
  expect_error([&] { fresh.add("--lse", path("sub/../n.bin")); }, "--lse", "same file");
}

TEST_F(OutputFilesTest, UnwritablePathsAreRefusedBeforeAnyWork) {
  OutputFiles outputs;
  expect_error([&] { outputs.add("--out", ""); }, "--out", "empty");
  expect_error([&] { outputs.add("--out", dir_.string()); }, "--out", "directory");
  expect_error([&] { outputs.add("--out", path("missing/o.bin")); }, "--out", "existing directory");
  put(path("file"), "x");
  expect_error([&] { outputs.add("--out", path("file/o.bin")); }, "--out", "Not a directory");
  EXPECT_EQ(entries(), (std::set<std::string>{"file"}));
}

TEST_F(OutputFilesTest, FifoIsWrittenDirectly) {
  const std::string fifo = path("out.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // The reader runs detached: were the FIFO replaced by a file, it would block in open
  // forever, and the test fails on the timeout instead of hanging.
  auto received = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = received->get_future();
  std::thread([fifo, received] { received->set_value(contents(fifo)); }).detach();
  write_file(fifo, "through the pipe");
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the FIFO was never written";
  EXPECT_EQ(result.get(), "through the pipe");
  struct stat st;
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(OutputFilesTest, ReplacementKeepsTheModeWithoutSetuid) {
  put(path("tool"), "old");
  ASSERT_EQ(::chmod(path("tool").c_str(), 04750), 0);
  write_file(path("tool"), "new");
  struct stat st;
  ASSERT_EQ(::stat(path("tool").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(contents(path("tool")), "new");
}

}  // namespace
