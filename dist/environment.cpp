#include "dist/environment.h"

#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace seqpar::dist {

namespace {

// The variable names one launcher uses; local_size may be null (not provided).
struct LauncherVariables {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr LauncherVariables kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
    // MPICH's and Intel MPI's Hydra (mpiexec); last, since srun can set PMI_* too.
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
};

// A value as an error message quotes it: its first 40 characters at most.
std::string shortened(const std::string& text) {
  return text.size() <= 40 ? text : text.substr(0, 40) + "... (" + std::to_string(text.size()) + " characters)";
}

// Digits only: "4", not " 4", "4x", "-1" or "".
int parse_count(const std::string& name, const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 9 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  SEQPAR_INPUT_CHECK(digits, "environment: ", name, "='", shortened(text),
                     "' is not a non-negative integer");
  return std::stoi(text);
}

// The launcher's variables that are set, each checked on its own (and the rank against
// the size when both are there), whole set or not: a malformed value is a mistake even
// where the set is incomplete, and is named rather than ignored.
void check_present_values(const EnvironmentLookup& lookup, const LauncherVariables& names) {
  std::optional<int> rank, size;
  if (const auto text = lookup(names.rank)) rank = parse_count(names.rank, *text);
  if (const auto text = lookup(names.size)) size = parse_count(names.size, *text);
  if (const auto text = lookup(names.local_rank)) parse_count(names.local_rank, *text);
  if (names.local_size) {
    if (const auto text = lookup(names.local_size)) parse_count(names.local_size, *text);
  }
  SEQPAR_INPUT_CHECK(!size || *size >= 1, "environment: ", names.size, "=", *size,
                     ": a world needs at least one rank");
  SEQPAR_INPUT_CHECK(!rank || !size || *rank < *size, "environment: ", names.rank, "=", *rank,
                     " is not below ", names.size, "=", *size);
}

LaunchEnvironment read_ranks(const EnvironmentLookup& lookup, const LauncherVariables& names) {
  LaunchEnvironment env;
  env.launcher = names.launcher;
  // seqpar's own launcher (dist/launcher.h) sets torchrun's variables and says so.
  if (env.launcher == "torchrun" && lookup(kSeqparLauncherVariable)) env.launcher = "seqpar --nproc";
  env.variables = std::string(names.rank) + ", " + names.size + ", " + names.local_rank;
  env.rank = parse_count(names.rank, *lookup(names.rank));
  env.world_size = parse_count(names.size, *lookup(names.size));
  env.local_rank = parse_count(names.local_rank, *lookup(names.local_rank));
  if (names.local_size) {
    if (auto local_size = lookup(names.local_size)) {
      env.local_world_size = parse_count(names.local_size, *local_size);
    }
  }
  SEQPAR_INPUT_CHECK(env.world_size >= 1, "environment: ", names.size, "=", env.world_size,
               ": a world needs at least one rank");
  SEQPAR_INPUT_CHECK(env.rank < env.world_size, "environment: ", names.rank, "=", env.rank,
               " is not below ", names.size, "=", env.world_size);
  SEQPAR_INPUT_CHECK(env.local_world_size < 0 || env.local_rank < env.local_world_size, "environment: ",
               names.local_rank, "=", env.local_rank, " is not below ", names.local_size, "=",
               env.local_world_size);
  return env;
}

// Under torchrun, its agent already listens on MASTER_PORT (its TCPStore), so rank 0
// cannot bind NCCL's bootstrap there; the next port is used instead. Export
// NCCL_COMM_ID to choose the address yourself.
void read_rendezvous_address(const EnvironmentLookup& lookup, LaunchEnvironment& env) {
  const auto address = lookup("MASTER_ADDR");
  const auto port = lookup("MASTER_PORT");
  const auto comm_id = lookup("NCCL_COMM_ID");
  if (address && port) {
    env.master_address = *address;
    env.master_port = parse_count("MASTER_PORT", *port);
    SEQPAR_INPUT_CHECK(!address->empty(), "environment: MASTER_ADDR is empty");
    SEQPAR_INPUT_CHECK(env.master_port >= 1 && env.master_port <= 65535, "environment: MASTER_PORT=",
                 env.master_port, " is not a TCP port (1..65535)");
  }
  if (comm_id && !comm_id->empty()) {
    env.nccl_comm_id = *comm_id;
    return;
  }
  int nccl_port = env.master_port;
  if (lookup("TORCHELASTIC_RUN_ID")) ++nccl_port;
  SEQPAR_INPUT_CHECK(nccl_port <= 65535, "environment: MASTER_PORT=", env.master_port,
               " leaves no port for NCCL's bootstrap (it uses MASTER_PORT + 1 under torchrun)");
  // An IPv6 literal needs brackets to keep its colons apart from the port's.
  const bool ipv6 = env.master_address.find(':') != std::string::npos &&
                    env.master_address.front() != '[';
  env.nccl_comm_id = (ipv6 ? "[" + env.master_address + "]" : env.master_address) + ":" +
                     std::to_string(nccl_port);
}

// A launch is a launcher's whole set: rank, size and local rank, and where rank 0
// listens (MASTER_ADDR and MASTER_PORT, or NCCL_COMM_ID). Less is not one: an sbatch or
// salloc shell sets SLURM_PROCID and SLURM_NTASKS for the job, not for a rank of it.
bool is_complete(const EnvironmentLookup& lookup, const LauncherVariables& names) {
  const auto comm_id = lookup("NCCL_COMM_ID");
  const bool address = (lookup("MASTER_ADDR") && lookup("MASTER_PORT")) ||
                       (comm_id && !comm_id->empty());
  return lookup(names.rank) && lookup(names.size) && lookup(names.local_rank) && address;
}

}  // namespace

std::optional<LaunchEnvironment> parse_launch_environment(const EnvironmentLookup& lookup) {
  for (const LauncherVariables& names : kLaunchers) check_present_values(lookup, names);
  for (const LauncherVariables& names : kLaunchers) {
    if (!is_complete(lookup, names)) continue;
    LaunchEnvironment env = read_ranks(lookup, names);
    read_rendezvous_address(lookup, env);
    return env;
  }
  return std::nullopt;
}

std::optional<LaunchEnvironment> parse_launch_environment(
    const std::map<std::string, std::string>& variables) {
  return parse_launch_environment([&](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  });
}

std::string ignored_launch_variables(const EnvironmentLookup& lookup) {
  if (parse_launch_environment(lookup)) return "";
  std::string set;
  for (const LauncherVariables& names : kLaunchers) {
    for (const char* name : {names.rank, names.size, names.local_rank}) {
      if (lookup(name)) set += (set.empty() ? "" : ", ") + std::string(name);
    }
  }
  return set;
}

namespace {

std::optional<std::string> process_variable(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace

std::optional<LaunchEnvironment> launch_environment_from_process() {
  return parse_launch_environment(process_variable);
}

std::string ignored_launch_variables_from_process() {
  return ignored_launch_variables(process_variable);
}

}  // namespace seqpar::dist
