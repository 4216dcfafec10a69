#include "dist/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "dist/environment.h"

extern char** environ;

namespace seqpar::dist {

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t pending_signal = 0;
extern "C" void remember_signal(int signal) { pending_signal = signal; }

// For the duration of a launch: SIGINT and SIGTERM are caught (and forwarded to
// the ranks by the supervising loop), SIGPIPE is ignored (a closed stdout must not
// kill the launcher while ranks still run). The previous handlers come back after.
class SignalGuard {
 public:
  SignalGuard() {
    pending_signal = 0;
    struct sigaction forward {};
    forward.sa_handler = remember_signal;
    sigemptyset(&forward.sa_mask);
    sigaction(SIGINT, &forward, &saved_interrupt_);
    sigaction(SIGTERM, &forward, &saved_terminate_);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &saved_pipe_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &saved_interrupt_, nullptr);
    sigaction(SIGTERM, &saved_terminate_, nullptr);
    sigaction(SIGPIPE, &saved_pipe_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction saved_interrupt_ {}, saved_terminate_ {}, saved_pipe_ {};
};

// One child's stdout or stderr, turned into "[rank R] ..." lines on our side.
struct OutputStream {
  int fd = -1;  // read end of the pipe; -1 once closed
  int target_fd = 1;
  std::string prefix;
  std::string pending;  // the start of a line not yet ended
};

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
};

// The first rank that failed, and with which status.
struct Failure {
  int rank = -1;
  int status = 0;
};

// Asks the kernel for a port nobody listens on. Another process could take it
// before rank 0 binds it; on one machine that race is rare enough.
int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SEQPAR_CHECK(fd >= 0, "launcher: socket() failed: ", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int saved_errno = errno;
  close(fd);
  SEQPAR_CHECK(ok, "launcher: could not find a free port: ", std::strerror(saved_errno));
  return ntohs(address.sin_port);
}

// This process's environment, minus what a launcher sets, plus this rank's values.
std::vector<std::string> child_environment(int rank, int nproc, int port) {
  static const char* const kReplaced[] = {"RANK=",        "WORLD_SIZE=",  "LOCAL_RANK=",
                                          "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                                          "TORCHELASTIC_RUN_ID=", "SEQPAR_NPROC_LAUNCHER="};
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    bool replaced = false;
    for (const char* name : kReplaced) replaced |= std::strncmp(*entry, name, std::strlen(name)) == 0;
    if (!replaced) environment.emplace_back(*entry);
  }
  environment.push_back("RANK=" + std::to_string(rank));
  environment.push_back("WORLD_SIZE=" + std::to_string(nproc));
  environment.push_back("LOCAL_RANK=" + std::to_string(rank));
  environment.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
  environment.push_back("MASTER_ADDR=127.0.0.1");
  environment.push_back("MASTER_PORT=" + std::to_string(port));
  environment.push_back(std::string(kSeqparLauncherVariable) + "=1");
  return environment;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Runs in the forked child: only async-signal-safe calls from here to execve, since
// the parent may have had other threads.
[[noreturn]] void exec_child(const char* path, char* const argv[], char* const envp[],
                             int stdout_fd, int stderr_fd, pid_t launcher) {
  // Its own process group: a terminal's Ctrl-C then reaches the launcher alone,
  // which forwards it once, instead of every rank receiving it twice.
  setpgid(0, 0);
  // A launcher killed by SIGKILL cannot stop its ranks; the kernel does it instead.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(1);
  signal(SIGPIPE, SIG_DFL);  // an ignored signal would stay ignored across execve
  dup2(stdout_fd, STDOUT_FILENO);
  dup2(stderr_fd, STDERR_FILENO);
  execve(path, argv, envp);
  static const char message[] = "seqpar launcher: execve of the rank failed\n";
  (void)!write(STDERR_FILENO, message, sizeof message - 1);
  _exit(127);
}

void open_pipe(int ends[2]) {
  SEQPAR_CHECK(pipe2(ends, O_CLOEXEC) == 0, "launcher: pipe2 failed: ", std::strerror(errno));
  fcntl(ends[0], F_SETFL, fcntl(ends[0], F_GETFL) | O_NONBLOCK);
}

RankProcess spawn_rank(const LaunchOptions& options, int rank, int port,
                       std::vector<OutputStream>& streams) {
  std::vector<std::string> arguments = options.arguments;
  std::vector<std::string> environment = child_environment(rank, options.nproc, port);
  const std::vector<char*> argv = pointers_to(arguments);
  const std::vector<char*> envp = pointers_to(environment);
  int out[2], err[2];
  open_pipe(out);
  open_pipe(err);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_child(options.executable.c_str(), argv.data(), envp.data(), out[1], err[1], launcher);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    SEQPAR_FAIL("launcher: fork failed for rank ", rank, ": ", std::strerror(errno));
  }
  setpgid(pid, pid);  // also here, so the group exists before we might signal it
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  streams.push_back({out[0], options.output_fd, prefix, ""});
  streams.push_back({err[0], options.error_fd, prefix, ""});
  return {rank, pid, true};
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t written = write(fd, text.data() + done, text.size() - done);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // nowhere to write to: drop the output, keep supervising
    done += static_cast<size_t>(written);
  }
}

// Writes every complete line with its prefix; at the end of the stream also the
// unfinished last one. A "line" longer than 64 KiB is cut, so memory stays bounded.
void emit_lines(OutputStream& stream, bool at_end) {
  std::string out;
  size_t start = 0;
  for (size_t end; (end = stream.pending.find('\n', start)) != std::string::npos; start = end + 1) {
    out += stream.prefix;
    out.append(stream.pending, start, end - start + 1);
  }
  stream.pending.erase(0, start);
  if (!stream.pending.empty() && (at_end || stream.pending.size() > 65536)) {
    out += stream.prefix + stream.pending + "\n";
    stream.pending.clear();
  }
  write_all(stream.target_fd, out);
}

// Reads what the pipe holds now; closes it at end of file.
void pump(OutputStream& stream) {
  char buffer[16384];
  for (;;) {
    const ssize_t count = read(stream.fd, buffer, sizeof buffer);
    if (count > 0) {
      stream.pending.append(buffer, static_cast<size_t>(count));
      continue;
    }
    if (count < 0 && errno == EINTR) continue;
    if (count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close(stream.fd);  // end of file, or an error that ends the stream just the same
    stream.fd = -1;
    break;
  }
  emit_lines(stream, stream.fd < 0);
}

void pump_ready_streams(std::vector<OutputStream>& streams, int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<OutputStream*> owners;
  for (OutputStream& stream : streams) {
    if (stream.fd < 0) continue;
    fds.push_back({stream.fd, POLLIN, 0});
    owners.push_back(&stream);
  }
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // timeout, or EINTR (a signal)
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0) pump(*owners[i]);
  }
}

void signal_running(const std::vector<RankProcess>& ranks, int signal_number) {
  for (const RankProcess& rank : ranks) {
    if (rank.running) kill(-rank.pid, signal_number);  // the rank's whole process group
  }
}

int status_code(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

// Collects ranks that exited. The first to fail is remembered and reported, and the
// others are asked to stop. Returns true when that happened just now. After the user's
// interrupt (`interrupted`), ranks that end are not failures of their own.
bool reap_exited(std::vector<RankProcess>& ranks, Failure& failure, int error_fd,
                 bool interrupted) {
  bool first_failure_now = false;
  for (RankProcess& rank : ranks) {
    int wait_status = 0;
    if (!rank.running || waitpid(rank.pid, &wait_status, WNOHANG) != rank.pid) continue;
    rank.running = false;
    const int status = status_code(wait_status);
    if (status == 0 || failure.rank >= 0 || interrupted) continue;
    failure = {rank.rank, status};
    first_failure_now = true;
    std::string how = WIFSIGNALED(wait_status)
                          ? "was killed by signal " + std::to_string(WTERMSIG(wait_status)) + " (" +
                                strsignal(WTERMSIG(wait_status)) + ")"
                          : "exited with status " + std::to_string(status);
    write_all(error_fd, "[launcher] rank " + std::to_string(rank.rank) + " " + how +
                            "; stopping the other ranks\n");
  }
  return first_failure_now;
}

bool any_running(const std::vector<RankProcess>& ranks) {
  for (const RankProcess& rank : ranks) {
    if (rank.running) return true;
  }
  return false;
}

bool any_open(const std::vector<OutputStream>& streams) {
  for (const OutputStream& stream : streams) {
    if (stream.fd >= 0) return true;
  }
  return false;
}

// The loop: forward signals, copy output, reap ranks, enforce the grace period.
// After the last rank exits, its pipes close at once unless a process it started
// still holds them; those get one more second.
int supervise(std::vector<RankProcess>& ranks, std::vector<OutputStream>& streams,
              const LaunchOptions& options) {
  Failure failure;
  int received_signal = 0;
  std::optional<Clock::time_point> kill_at, all_exited_at;
  Clock::time_point terminate_at = Clock::time_point::max();  // max: not planned
  while (any_running(ranks) || any_open(streams)) {
    if (const int signal_number = pending_signal) {
      pending_signal = 0;
      if (!received_signal && failure.rank < 0) {
        write_all(options.error_fd, std::string("[launcher] ") +
                                        (signal_number == SIGINT ? "interrupted by the user"
                                                                 : strsignal(signal_number)) +
                                        "; stopping the ranks\n");
      }
      received_signal = signal_number;
      signal_running(ranks, signal_number);
      if (!kill_at) kill_at = Clock::now() + options.grace;
    }
    pump_ready_streams(streams, 50);
    if (reap_exited(ranks, failure, options.error_fd, received_signal != 0)) {
      terminate_at = Clock::now() + options.drain;
    }
    if (Clock::now() >= terminate_at) {
      signal_running(ranks, SIGTERM);
      terminate_at = Clock::time_point::max();
      if (!kill_at) kill_at = Clock::now() + options.grace;
    }
    if (kill_at && Clock::now() >= *kill_at) signal_running(ranks, SIGKILL);
    if (!any_running(ranks) && !all_exited_at) all_exited_at = Clock::now();
    if (all_exited_at && Clock::now() - *all_exited_at > std::chrono::seconds(1)) {
      for (OutputStream& stream : streams) {
        if (stream.fd < 0) continue;
        close(stream.fd);
        stream.fd = -1;
        emit_lines(stream, true);
      }
    }
  }
  if (failure.rank >= 0) return failure.status;
  return received_signal ? 128 + received_signal : 0;
}

}  // namespace

// The launcher holds two pipes per rank open, and briefly four while one starts; a
// limit below that would fail midway, after some ranks had started. The soft limit is
// raised towards the hard one where that is enough.
void ensure_descriptors_for(int nproc) {
  const rlim_t needed = static_cast<rlim_t>(nproc) * 2 + 64;
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed) return;
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
    limit.rlim_cur = needed;
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
  }
  SEQPAR_INPUT_FAIL("--nproc ", nproc, ": needs about ", needed,
                    " open files, but the limit is ", limit.rlim_cur, " (see ulimit -n)");
}

// Each rank takes a GPU of its own and talks over NCCL; without them every rank would
// fail alike, so the launcher says it once, before starting any.
void check_gpus_for(int nproc) {
#ifndef SEQPAR_WITH_NCCL
  SEQPAR_INPUT_FAIL("--nproc ", nproc, ": this seqpar was built without NCCL, which --nproc's "
                    "one process per GPU needs; run without --nproc");
#endif
  const int gpus = cuda_device_count();
  SEQPAR_INPUT_CHECK(gpus >= nproc, "--nproc ", nproc, " starts one process per GPU, but this "
                     "machine has ", gpus, " GPU(s); ",
                     gpus == 0 ? std::string("run without --nproc")
                               : "use --nproc " + std::to_string(gpus) + " or fewer");
}

int launch_ranks(const LaunchOptions& options) {
  SEQPAR_CHECK(options.nproc >= 1, "launcher: --nproc must be at least 1, got ", options.nproc);
  ensure_descriptors_for(options.nproc);
  SEQPAR_CHECK(!options.arguments.empty(), "launcher: the arguments need at least argv[0]");
  const int port = pick_free_port();
  SignalGuard signals;
  std::vector<RankProcess> ranks;
  std::vector<OutputStream> streams;
  try {
    for (int rank = 0; rank < options.nproc; ++rank) {
      ranks.push_back(spawn_rank(options, rank, port, streams));
    }
  } catch (...) {  // a rank could not start: the ones already running go too
    signal_running(ranks, SIGKILL);
    for (const RankProcess& rank : ranks) waitpid(rank.pid, nullptr, 0);
    for (const OutputStream& stream : streams) close(stream.fd);
    throw;
  }
  return supervise(ranks, streams, options);
}

std::optional<int> take_nproc_flag(std::vector<std::string>& arguments) {
  std::optional<int> nproc;
  for (size_t i = 1; i < arguments.size();) {
    const std::string& argument = arguments[i];
    const bool separate = argument == "--nproc";
    if (!separate && argument.rfind("--nproc=", 0) != 0) {
      ++i;
      continue;
    }
    SEQPAR_INPUT_CHECK(!nproc, "--nproc is given more than once");
    SEQPAR_INPUT_CHECK(!separate || i + 1 < arguments.size(), "--nproc needs a number of ranks");
    const std::string value = separate ? arguments[i + 1] : argument.substr(8);
    const bool digits = !value.empty() && value.size() <= 6 &&
                        value.find_first_not_of("0123456789") == std::string::npos;
    SEQPAR_INPUT_CHECK(digits && std::stoi(value) >= 1, "--nproc '", value,
                       "' is not a positive number of ranks");
    SEQPAR_INPUT_CHECK(std::stoi(value) <= kMaxLaunchedRanks, "--nproc ", value,
                       ": at most ", kMaxLaunchedRanks, " ranks on one machine");
    nproc = std::stoi(value);
    arguments.erase(arguments.begin() + static_cast<std::ptrdiff_t>(i),
                    arguments.begin() + static_cast<std::ptrdiff_t>(i + (separate ? 2 : 1)));
  }
  return nproc;
}

std::optional<int> maybe_launch(int argc, char** argv) {
  std::vector<std::string> arguments(argv, argv + argc);
  try {
    const std::optional<int> nproc = take_nproc_flag(arguments);
    if (!nproc) return std::nullopt;
    const char* outer_rank = std::getenv("RANK");
    SEQPAR_INPUT_CHECK(outer_rank == nullptr, "--nproc inside a rank that a launcher already started (RANK=",
                       outer_rank ? outer_rank : "", "): use either --nproc or the outer launcher");
    check_gpus_for(*nproc);
    LaunchOptions options;
    options.nproc = *nproc;
    options.arguments = arguments;
    return launch_ranks(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "seqpar launcher: %s\n", error.what());
    return 2;
  }
}

}  // namespace seqpar::dist
