// The --nproc launcher, driving /bin/sh children instead of a seqpar program: the
// flag parsing, the rendezvous variables, the "[rank R] " prefixes, and stopping
// every rank when one fails.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "dist/launcher.h"

using namespace seqpar;
using Catch::Matchers::Contains;
using Arguments = std::vector<std::string>;

namespace {

// A temporary file standing in for the launcher's stdout or stderr. (A pipe could
// fill up and block the launcher, since nobody reads it until the end.)
class CapturedOutput {
 public:
  CapturedOutput() : file_(std::tmpfile()) { REQUIRE(file_ != nullptr); }
  ~CapturedOutput() { std::fclose(file_); }
  int fd() const { return fileno(file_); }
  std::string text() const {
    std::string text;
    char buffer[4096];
    for (off_t at = 0;;) {
      const ssize_t count = pread(fd(), buffer, sizeof buffer, at);
      if (count <= 0) return text;
      text.append(buffer, static_cast<size_t>(count));
      at += count;
    }
  }

 private:
  std::FILE* file_;
};

dist::LaunchOptions shell(int nproc, const std::string& script, const CapturedOutput& out,
                          const CapturedOutput& err) {
  dist::LaunchOptions options;
  options.nproc = nproc;
  options.executable = "/bin/sh";
  options.arguments = {"sh", "-c", script};
  options.output_fd = out.fd();
  options.error_fd = err.fd();
  options.grace = std::chrono::milliseconds(2000);
  return options;
}

}  // namespace

TEST_CASE("launcher: --nproc is taken out of the arguments", "[dist]") {
  Arguments arguments{"prog", "--config", "a.toml", "--nproc", "4", "--steps", "2"};
  CHECK(dist::take_nproc_flag(arguments) == 4);
  CHECK(arguments == Arguments{"prog", "--config", "a.toml", "--steps", "2"});
  arguments = {"prog", "--nproc=2"};
  CHECK(dist::take_nproc_flag(arguments) == 2);
  CHECK(arguments == Arguments{"prog"});
  arguments = {"prog", "--nprocs", "2"};
  CHECK_FALSE(dist::take_nproc_flag(arguments).has_value());
  CHECK(arguments.size() == 3);
}

TEST_CASE("launcher: a malformed --nproc is an error", "[dist]") {
  Arguments arguments{"prog", "--nproc"};
  CHECK_THROWS_WITH(dist::take_nproc_flag(arguments), Contains("needs a number of ranks"));
  arguments = {"prog", "--nproc", "0"};
  CHECK_THROWS_WITH(dist::take_nproc_flag(arguments), Contains("'0' is not a positive number"));
  arguments = {"prog", "--nproc=two"};
  CHECK_THROWS_WITH(dist::take_nproc_flag(arguments), Contains("'two'"));
  arguments = {"prog", "--nproc", "2", "--nproc", "3"};
  CHECK_THROWS_WITH(dist::take_nproc_flag(arguments), Contains("more than once"));
}

TEST_CASE("launcher: every rank runs with its variables, its lines prefixed", "[dist]") {
  const CapturedOutput out, err;
  const int status = dist::launch_ranks(shell(
      3,
      "echo \"rank $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE at $MASTER_ADDR\"; "
      "test \"$MASTER_PORT\" -gt 0 || echo 'no port'; echo oops >&2; printf 'no newline'",
      out, err));
  CHECK(status == 0);
  const std::string text = out.text();
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    CHECK_THAT(text, Contains("[rank " + r + "] rank " + r + " of 3 local " + r + "/3 at 127.0.0.1\n"));
    CHECK_THAT(text, Contains("[rank " + r + "] no newline\n"));
    CHECK_THAT(err.text(), Contains("[rank " + r + "] oops\n"));
  }
  CHECK_THAT(text, !Contains("no port"));
}

TEST_CASE("launcher: one failing rank stops the others and sets the exit status", "[dist]") {
  const CapturedOutput out, err;
  const auto start = std::chrono::steady_clock::now();
  const int status = dist::launch_ranks(
      shell(3, "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30", out, err));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(status == 3);
  CHECK(seconds < 10.0);
  CHECK_THAT(err.text(), Contains("[launcher] rank 1 exited with status 3"));
}

TEST_CASE("launcher: a rank killed by a signal reports 128 + its number", "[dist]") {
  const CapturedOutput out, err;
  CHECK(dist::launch_ranks(shell(1, "kill -9 $$", out, err)) == 128 + 9);
  CHECK_THAT(err.text(), Contains("rank 0 was killed by signal 9"));
}

TEST_CASE("launcher: the other ranks may report their own errors before SIGTERM", "[dist]") {
  const CapturedOutput out, err;
  const int status = dist::launch_ranks(shell(
      2, "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 0.5; echo 'rank 0: my own error' >&2; exit 1",
      out, err));
  CHECK(status == 3);
  CHECK_THAT(err.text(), Contains("[rank 0] rank 0: my own error"));
}

TEST_CASE("launcher: Ctrl-C is the user's interrupt, status 130", "[dist]") {
  const CapturedOutput out, err;
  // Rank 0 plays the terminal: SIGINT to the launcher (this process), which forwards it.
  const int status = dist::launch_ranks(
      shell(2, "if [ \"$RANK\" = 0 ]; then kill -INT $PPID; fi; sleep 30", out, err));
  CHECK(status == 130);
  CHECK_THAT(err.text(), Contains("[launcher] interrupted by the user"));
  CHECK_THAT(err.text(), !Contains("killed by signal"));
}

TEST_CASE("launcher: --nproc is bounded", "[dist]") {
  Arguments arguments{"prog", "--nproc", "100000"};
  CHECK_THROWS_AS(dist::take_nproc_flag(arguments), InputError);
  arguments = {"prog", "--nproc", "1025"};
  CHECK_THROWS_WITH(dist::take_nproc_flag(arguments), Contains("at most 1024"));
  arguments = {"prog", "--nproc", "1024"};
  CHECK(dist::take_nproc_flag(arguments) == 1024);
}
