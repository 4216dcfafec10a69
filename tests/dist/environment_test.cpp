// Reading the launcher's environment, from fake variable maps (never the real one).
#include <catch2/catch.hpp>

#include "core/error.h"
#include "dist/environment.h"

#include <optional>

using namespace seqpar;
using Catch::Matchers::Contains;
using Variables = std::map<std::string, std::string>;

namespace {
Variables torchrun(const std::string& rank) {
  return {{"RANK", rank},          {"WORLD_SIZE", "4"},         {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29500"}};
}
}  // namespace

TEST_CASE("environment: torchrun and --nproc variables", "[dist]") {
  const auto env = dist::parse_launch_environment(torchrun("3"));
  REQUIRE(env.has_value());
  CHECK(env->launcher == "torchrun");
  CHECK(env->rank == 3);
  CHECK(env->world_size == 4);
  CHECK(env->local_rank == 1);
  CHECK(env->local_world_size == 2);
  CHECK(env->master_address == "10.0.0.7");
  CHECK(env->master_port == 29500);
  CHECK(env->nccl_comm_id == "10.0.0.7:29500");
}

TEST_CASE("environment: seqpar's --nproc launcher is named as itself", "[dist]") {
  Variables variables = torchrun("2");
  variables[dist::kSeqparLauncherVariable] = "1";
  const auto env = dist::parse_launch_environment(variables);
  REQUIRE(env.has_value());
  CHECK(env->launcher == "seqpar --nproc");
  CHECK(env->rank == 2);
  CHECK(env->nccl_comm_id == "10.0.0.7:29500");  // its own port: no torchrun agent there
}

TEST_CASE("environment: under torchrun's agent NCCL takes the next port", "[dist]") {
  Variables variables = torchrun("0");
  variables["TORCHELASTIC_RUN_ID"] = "none";
  CHECK(dist::parse_launch_environment(variables)->nccl_comm_id == "10.0.0.7:29501");
  variables["MASTER_PORT"] = "65535";
  CHECK_THROWS_WITH(dist::parse_launch_environment(variables), Contains("MASTER_PORT + 1"));
}

TEST_CASE("environment: mpirun (Open MPI) variables", "[dist]") {
  const auto env = dist::parse_launch_environment(Variables{
      {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
      {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}});
  REQUIRE(env.has_value());
  CHECK(env->launcher == "mpirun");
  CHECK(env->rank == 5);
  CHECK(env->world_size == 8);
  CHECK(env->local_rank == 1);
  CHECK(env->local_world_size == 4);
  CHECK(env->nccl_comm_id == "node0:1234");
}

TEST_CASE("environment: Slurm variables, with NCCL_COMM_ID instead of MASTER_*", "[dist]") {
  const auto env = dist::parse_launch_environment(Variables{
      {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"},
      {"NCCL_COMM_ID", "192.168.1.1:7000"}});
  REQUIRE(env.has_value());
  CHECK(env->launcher == "slurm");
  CHECK(env->rank == 2);
  CHECK(env->world_size == 3);
  CHECK(env->local_rank == 0);
  CHECK(env->local_world_size == -1);
  CHECK(env->master_address.empty());
  CHECK(env->nccl_comm_id == "192.168.1.1:7000");
}

TEST_CASE("environment: MPICH / Intel MPI (Hydra) PMI variables", "[dist]") {
  const auto env = dist::parse_launch_environment(Variables{
      {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"},
      {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  REQUIRE(env.has_value());
  CHECK(env->launcher == "mpich");
  CHECK(env->rank == 3);
  CHECK(env->world_size == 4);
  CHECK(env->local_rank == 1);
  CHECK(env->local_world_size == 2);
  CHECK(env->nccl_comm_id == "node0:29500");
  CHECK_FALSE(dist::parse_launch_environment(Variables{{"PMI_RANK", "0"}}).has_value());
  // srun --mpi=pmi2 sets PMI_* beside its own: Slurm's names are read first.
  Variables slurm{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                  {"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"NCCL_COMM_ID", "h:1"}};
  CHECK(dist::parse_launch_environment(slurm)->launcher == "slurm");
}

TEST_CASE("environment: torchrun's variables win over Slurm's", "[dist]") {
  Variables variables = torchrun("1");
  variables["SLURM_PROCID"] = "0";
  variables["SLURM_NTASKS"] = "1";
  variables["SLURM_LOCALID"] = "0";
  CHECK(dist::parse_launch_environment(variables)->launcher == "torchrun");
  CHECK(dist::parse_launch_environment(variables)->rank == 1);
}

TEST_CASE("environment: none set means a single plain process", "[dist]") {
  CHECK_FALSE(dist::parse_launch_environment(Variables{}).has_value());
  CHECK_FALSE(dist::parse_launch_environment(Variables{{"MASTER_ADDR", "x"}}).has_value());
}

TEST_CASE("environment: IPv6 master addresses get brackets", "[dist]") {
  Variables variables = torchrun("0");
  variables["MASTER_ADDR"] = "fe80::1";
  CHECK(dist::parse_launch_environment(variables)->nccl_comm_id == "[fe80::1]:29500");
}

TEST_CASE("environment: only a launcher's whole set is a launch", "[dist]") {
  // An sbatch or salloc shell: Slurm's job variables, no address for rank 0.
  CHECK_FALSE(dist::parse_launch_environment(Variables{
      {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}}).has_value());
  CHECK_FALSE(dist::parse_launch_environment(Variables{{"SLURM_PROCID", "0"}}).has_value());
  for (const char* missing : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Variables variables = torchrun("1");
    variables.erase(missing);
    CHECK_FALSE(dist::parse_launch_environment(variables).has_value());
  }
  Variables variables = torchrun("1");
  variables.erase("MASTER_ADDR");
  variables["NCCL_COMM_ID"] = "h:1";
  CHECK(dist::parse_launch_environment(variables)->nccl_comm_id == "h:1");
}

TEST_CASE("environment: malformed values are named", "[dist]") {
  Variables variables;
  CHECK_THROWS_AS(dist::parse_launch_environment(torchrun("abc")), InputError);
  CHECK_THROWS_WITH(dist::parse_launch_environment(torchrun("abc")),
                    Contains("RANK='abc' is not a non-negative integer"));
  CHECK_THROWS_WITH(dist::parse_launch_environment(torchrun("-1")), Contains("RANK='-1'"));
  CHECK_THROWS_WITH(dist::parse_launch_environment(torchrun(" 1")), Contains("RANK=' 1'"));
  CHECK_THROWS_WITH(dist::parse_launch_environment(torchrun("4")),
                    Contains("RANK=4 is not below WORLD_SIZE=4"));
  variables = torchrun("0");
  variables["LOCAL_RANK"] = "2";
  CHECK_THROWS_WITH(dist::parse_launch_environment(variables),
                    Contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  variables = torchrun("0");
  variables["WORLD_SIZE"] = "0";
  CHECK_THROWS_WITH(dist::parse_launch_environment(variables), Contains("at least one rank"));
  variables = torchrun("0");
  variables["MASTER_PORT"] = "70000";
  CHECK_THROWS_WITH(dist::parse_launch_environment(variables), Contains("MASTER_PORT=70000"));
}

TEST_CASE("environment: a malformed value is refused even where the set is incomplete", "[dist]") {
  CHECK_THROWS_WITH(dist::parse_launch_environment(
                        Variables{{"RANK", "0"}, {"WORLD_SIZE", "0"}, {"LOCAL_RANK", "0"}}),
                    Contains("WORLD_SIZE=0: a world needs at least one rank"));
  CHECK_THROWS_WITH(dist::parse_launch_environment(Variables{{"PMI_RANK", "abc"}, {"PMI_SIZE", "4"}}),
                    Contains("PMI_RANK='abc' is not a non-negative integer"));
  CHECK_THROWS_WITH(dist::parse_launch_environment(Variables{{"PMI_SIZE", "0"}}), Contains("PMI_SIZE=0"));
  CHECK_THROWS_WITH(dist::parse_launch_environment(Variables{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
                    Contains("SLURM_PROCID=4 is not below SLURM_NTASKS=4"));
  // A long value is quoted shortened.
  CHECK_THROWS_WITH(dist::parse_launch_environment(Variables{{"RANK", std::string(5000, '7')}}),
                    Contains("(5000 characters)") && !Contains(std::string(100, '7')));
}

TEST_CASE("environment: an ignored incomplete set is named; a whole set or none is not", "[dist]") {
  const auto ignored = [](const Variables& variables) {
    return dist::ignored_launch_variables([&](const std::string& name) -> std::optional<std::string> {
      const auto found = variables.find(name);
      if (found == variables.end()) return std::nullopt;
      return found->second;
    });
  };
  CHECK(ignored({{"PMI_RANK", "0"}}) == "PMI_RANK");
  CHECK(ignored({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}) == "SLURM_PROCID, SLURM_NTASKS");
  CHECK(ignored(torchrun("1")).empty());
  CHECK(ignored({}).empty());
  CHECK(dist::parse_launch_environment(torchrun("1"))->variables == "RANK, WORLD_SIZE, LOCAL_RANK");
}
