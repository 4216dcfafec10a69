// Where this process sits in a multi-process run, read from the variables its
// launcher sets. Four launchers are understood, tried in this order:
//
//   torchrun, seqpar --nproc   RANK, WORLD_SIZE, LOCAL_RANK (LOCAL_WORLD_SIZE)
//   mpirun (Open MPI)          OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (_LOCAL_SIZE)
//   srun (Slurm)               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   mpiexec (MPICH, Intel MPI) PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (MPI_LOCALNRANKS)
//
// Every launcher also needs to say where rank 0 listens, for NCCL's bootstrap:
// MASTER_ADDR and MASTER_PORT (torchrun sets them; export them yourself under mpirun
// or srun), or NCCL_COMM_ID=host:port directly. Only the whole set is a launch: the
// three rank variables and the address. Part of a set is no launch at all, as in an
// sbatch or salloc shell, which sets SLURM_PROCID for the job, not for one rank of it.
//
// Parsing takes a lookup function instead of calling getenv, so tests can pass a
// fake environment.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace seqpar::dist {

// Set (to "1") in every rank that seqpar's --nproc launcher starts.
inline constexpr const char* kSeqparLauncherVariable = "SEQPAR_NPROC_LAUNCHER";

struct LaunchEnvironment {
  // Whose variables were read: "torchrun", "seqpar --nproc" (torchrun's names, set by
  // dist/launcher.h, which also sets kSeqparLauncherVariable), "mpirun", "slurm" or
  // "mpich".
  std::string launcher;
  std::string variables;  // the rank variables read: "RANK, WORLD_SIZE, LOCAL_RANK"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;         // this rank's GPU on its node
  int local_world_size = -1;  // ranks on this node; -1 when the launcher does not say
  std::string master_address;  // empty when only NCCL_COMM_ID was given
  int master_port = 0;
  // host:port for NCCL_COMM_ID: where rank 0 hosts NCCL's bootstrap.
  std::string nccl_comm_id;
};

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// nullopt when no launcher's whole set is present (a plain single-process run).
// Throws seqpar::InputError naming the variable for a malformed value: one that is not
// a number, a rank outside the world, a world of 0, a port outside 1..65535, whether or
// not the set it belongs to is whole.
std::optional<LaunchEnvironment> parse_launch_environment(const EnvironmentLookup& lookup);
std::optional<LaunchEnvironment> parse_launch_environment(
    const std::map<std::string, std::string>& variables);

// The same, from this process's real environment.
std::optional<LaunchEnvironment> launch_environment_from_process();

// The launchers' rank variables that are set although they make no whole set
// ("SLURM_PROCID, SLURM_NTASKS" in an sbatch shell), so a program can say it ignores
// them; "" when there are none, or the set is whole.
std::string ignored_launch_variables(const EnvironmentLookup& lookup);
std::string ignored_launch_variables_from_process();

}  // namespace seqpar::dist
