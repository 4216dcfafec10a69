#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "apps/common/output_file.h"

using namespace seqpar;

namespace {

// A fresh directory for one test case, removed with its files at the end.
struct ScratchDirectory {
  std::string path;
  ScratchDirectory() {
    char name[] = "/tmp/seqpar_output_file_XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = name;
  }
  ~ScratchDirectory() {
    for (const std::string& entry : entries()) ::unlink((path + "/" + entry).c_str());
    ::rmdir(path.c_str());
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    DIR* listing = ::opendir(path.c_str());
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(listing);
    return names;
  }
};

std::string contents_of(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("OutputFile: written whole, through a temporary that does not stay", "[core][output]") {
  ScratchDirectory scratch;
  const std::string path = scratch.path + "/out.json";
  write_output_file(path, "first");
  write_output_file(path, "second, longer");  // replaces
  CHECK(contents_of(path) == "second, longer");
  CHECK(scratch.entries() == std::vector<std::string>{"out.json"});
  OutputFile checked(path);
  checked.write("read back");
  checked.commit(true);
  CHECK(contents_of(path) == "read back");
}

TEST_CASE("OutputFile: an abandoned or failed file leaves nothing", "[core][output]") {
  ScratchDirectory scratch;
  {
    OutputFile abandoned(scratch.path + "/never.json");
    abandoned.write("half");
  }  // an exception on the way would end here
  CHECK(scratch.entries().empty());
  CHECK_THROWS_WITH(write_output_file(scratch.path, "x"), Catch::Contains("Is a directory"));
  CHECK_THROWS_WITH(write_output_file(scratch.path + "/missing/x.json", "x"),
                    Catch::Contains("No such file or directory"));
  CHECK(scratch.entries().empty());
}

TEST_CASE("OutputFile: devices are written through and their errors reported", "[core][output]") {
  write_output_file("/dev/null", "discarded");
  struct stat status {};
  if (::stat("/dev/full", &status) == 0) {
    CHECK_THROWS_WITH(write_output_file("/dev/full", "x"),
                      Catch::Contains("/dev/full") && Catch::Contains("No space left on device"));
    REQUIRE(::stat("/dev/full", &status) == 0);
    CHECK(S_ISCHR(status.st_mode));  // still the device, not a regular file
  }
}

TEST_CASE("OutputFile: a FIFO without a reader fails instead of blocking", "[core][output]") {
  ScratchDirectory scratch;
  const std::string fifo = scratch.path + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(write_output_file(fifo, "x"), Catch::Contains("No such device or address"));
}

TEST_CASE("OutputFile: a link is refused, its target never written", "[core][output]") {
  ScratchDirectory scratch;
  const std::string target = scratch.path + "/target", link = scratch.path + "/link";
  write_output_file(target, "old");
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  CHECK_THROWS_WITH(write_output_file(link, "new"), Catch::Contains("is a symbolic link"));
  CHECK_THROWS_WITH(check_output_path("--plot", link), Catch::Contains("is a symbolic link"));
  struct stat status {};
  REQUIRE(::lstat(link.c_str(), &status) == 0);
  CHECK(S_ISLNK(status.st_mode));
  CHECK(contents_of(target) == "old");
  CHECK(scratch.entries().size() == 2);  // no temporary stays
  // A dangling link too: nothing is created where it points.
  const std::string dangling = scratch.path + "/dangling";
  REQUIRE(::symlink((scratch.path + "/nowhere").c_str(), dangling.c_str()) == 0);
  CHECK_THROWS_WITH(check_output_path("--json", dangling), Catch::Contains("is a symbolic link"));
  CHECK_THROWS(write_output_file(dangling, "x"));
  CHECK(::access((scratch.path + "/nowhere").c_str(), F_OK) != 0);
}

TEST_CASE("OutputFile: a link planted after the check is replaced, not followed", "[core][output]") {
  ScratchDirectory scratch;
  const std::string target = scratch.path + "/target", path = scratch.path + "/out";
  write_output_file(target, "precious");
  OutputFile file(path);
  REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);  // planted while the file is written
  file.write(std::string("new"));
  file.commit();
  struct stat status {};
  REQUIRE(::lstat(path.c_str(), &status) == 0);
  CHECK(S_ISREG(status.st_mode));
  CHECK(contents_of(path) == "new");
  CHECK(contents_of(target) == "precious");
}

TEST_CASE("check_output_path refuses directories and missing parents", "[core][output]") {
  ScratchDirectory scratch;
  CHECK_NOTHROW(check_output_path("--json", scratch.path + "/x.json"));
  CHECK_NOTHROW(check_output_path("--json", "/dev/null"));
  CHECK_THROWS_AS(check_output_path("--json", scratch.path), InputError);
  CHECK_THROWS_WITH(check_output_path("--json", scratch.path),
                    Catch::Contains("--json") && Catch::Contains("is a directory"));
  CHECK_THROWS_WITH(check_output_path("--plot", scratch.path + "/no/x.svg"),
                    Catch::Contains("--plot") && Catch::Contains("No such file"));
  // Probed by creating a temporary where the file goes, and nothing left there.
  CHECK_THROWS_WITH(check_output_path("--json", scratch.path + "/" + std::string(300, 'x')),
                    Catch::Contains("File name too long"));
  CHECK_THROWS_WITH(check_output_path("--plot", "/proc/x"), Catch::Contains("cannot create files"));
  CHECK(scratch.entries().empty());
}

TEST_CASE("remove_directory_tree removes a staging tree and follows no link", "[core][output]") {
  ScratchDirectory scratch;
  const std::string outside = scratch.path + "/outside", tree = scratch.path + "/tree";
  write_output_file(outside, "precious");
  REQUIRE(::mkdir(tree.c_str(), 0700) == 0);
  REQUIRE(::mkdir((tree + "/exact").c_str(), 0700) == 0);
  write_output_file(tree + "/exact/rank0.safetensors", "x");
  write_output_file(tree + "/inputs.safetensors", "x");
  REQUIRE(::symlink(scratch.path.c_str(), (tree + "/up").c_str()) == 0);
  REQUIRE(::symlink(outside.c_str(), (tree + "/exact/link").c_str()) == 0);
  const int fd = ::open(scratch.path.c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  remove_directory_tree(fd, "tree");
  ::close(fd);
  CHECK(::access(tree.c_str(), F_OK) != 0);
  CHECK(contents_of(outside) == "precious");
  CHECK(scratch.entries() == std::vector<std::string>{"outside"});
}
