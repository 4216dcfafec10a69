// The launcher: `--nproc N` on any seqpar program runs it as N ranks, like
// `torchrun --nproc-per-node N`, on one node.
//
//   int main(int argc, char** argv) {
//     if (auto status = seqpar::dist::maybe_launch(argc, argv)) return *status;
//     ...  // from here on this process is one rank (or a plain single process)
//   }
//
// The launcher process re-executes its own binary (/proc/self/exe) N times with the
// same arguments minus --nproc, each child with RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set. It prefixes
// every line a child prints with "[rank R] ", forwards SIGINT and SIGTERM, stops
// the other ranks (SIGTERM, then SIGKILL after a grace period) as soon as one fails,
// and exits with the status of the first rank that failed.
//
// Without the flag nothing happens, so the same program also runs under torchrun
// (--no-python), mpirun or srun (see dist/environment.h).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace seqpar::dist {

struct LaunchOptions {
  int nproc = 1;
  std::string executable = "/proc/self/exe";
  std::vector<std::string> arguments;  // argv for the children, argv[0] included
  int output_fd = 1;  // where the children's prefixed stdout lines go
  int error_fd = 2;   // and their stderr lines
  // After one rank fails, how long the others may go on before SIGTERM: a failure
  // usually makes them fail too, and their own error lines say more than a signal.
  std::chrono::milliseconds drain{3000};
  // After SIGTERM (or a forwarded signal), how long until SIGKILL.
  std::chrono::milliseconds grace{5000};
};

// The most ranks one launcher starts (each holds two pipes and a process).
constexpr int kMaxLaunchedRanks = 1024;

// Runs options.nproc ranks of options.executable and waits for all of them. Returns
// 0 when every rank exited 0, else the first failing rank's exit code (128 + signal
// number for a rank killed by a signal).
int launch_ranks(const LaunchOptions& options);

// Removes "--nproc N" or "--nproc=N" from `arguments` and returns N; nullopt when
// the flag is absent. Throws seqpar::InputError for a missing N, or one outside
// 1..kMaxLaunchedRanks.
std::optional<int> take_nproc_flag(std::vector<std::string>& arguments);

// The entry point for programs: returns the exit status when this process was the
// launcher (or the flag was malformed: status 2, message on stderr), nullopt when
// the program should go on as a rank or as a single process.
std::optional<int> maybe_launch(int argc, char** argv);

}  // namespace seqpar::dist
