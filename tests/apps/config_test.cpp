#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "apps/repro/config.h"
#include "apps/repro/policy.h"
#include "core/error.h"

using namespace seqpar::repro;

namespace {
ReproConfig with(const std::vector<std::string>& overrides) {
  return parse_config("", overrides, "test");
}
}  // namespace

TEST_CASE("configs/issue6868.toml is the built-in scenario", "[repro][config]") {
  const ReproConfig file = load_config(std::string(SEQPAR_SOURCE_DIR) + "configs/issue6868.toml");
  CHECK(to_toml(file) == to_toml(ReproConfig{}));
  CHECK(file.world_size() == 4);
  CHECK(file.adamw.lr == 1e-4);
  CHECK(file.adamw.beta2 == 0.999);
  CHECK(file.rows == 12000);
  // The TOML it prints reads back to the same configuration.
  CHECK(to_toml(parse_config(to_toml(file), {}, "round trip")) == to_toml(file));
}

TEST_CASE("overrides (--set) reach any key with a TOML value", "[repro][config]") {
  const ReproConfig config = with({"repro.rows=1001", "ds_config.optimizer.params.lr=3e-4",
                                   "ds_config.optimizer.params.betas=[0.8, 0.9]",
                                   "ds_config.data_parallel_size=2", "ds_config.gradient_clipping=0"});
  CHECK(config.rows == 1001);
  CHECK(config.adamw.lr == 3e-4);
  CHECK(config.adamw.beta1 == 0.8);
  CHECK(config.world_size() == 8);
  CHECK(config.gradient_clipping == 0);
}

TEST_CASE("bad configurations name the key and the value", "[repro][config][errors]") {
  CHECK_THROWS_WITH(with({"repro.colums=3"}), Catch::Contains("unknown config key repro.colums"));
  CHECK_THROWS_WITH(with({"ds_config.zero_optimization.stage=3"}),
                    Catch::Contains("ds_config.zero_optimization.stage = 3"));
  CHECK_THROWS_WITH(with({"repro.rows=\"many\""}),
                    Catch::Contains("repro.rows must be an integer") && Catch::Contains("\"many\""));
  CHECK_THROWS_WITH(with({"repro.rows=0"}), Catch::Contains("repro.rows = 0"));
  CHECK_THROWS_WITH(with({"repro.out_features=700"}),
                    Catch::Contains("repro.out_features = 700") && Catch::Contains("640"));
  CHECK_THROWS_WITH(with({"repro.rows=3"}), Catch::Contains("sequence_parallel_size = 4"));
  CHECK_THROWS_WITH(with({"ds_config.sequence_parallel_size=0"}),
                    Catch::Contains("sequence_parallel_size = 0"));
  CHECK_THROWS_WITH(with({"ds_config.optimizer.params.betas=[0.9]"}),
                    Catch::Contains("betas must be an array of two numbers"));
  CHECK_THROWS_WITH(with({"ds_config.optimizer.params.betas=[0.9, 1.0]"}),
                    Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(with({"ds_config.optimizer.type=\"SGD\""}), Catch::Contains("\"SGD\""));
  CHECK_THROWS_WITH(with({"ds_config.gradient_accumulation_steps=2"}),
                    Catch::Contains("gradient_accumulation_steps = 2"));
  CHECK_THROWS_WITH(with({"repro.rows"}), Catch::Contains("expected section.key=value"));
  CHECK_THROWS_WITH(with({"repro.rows=1 2"}), Catch::Contains("not TOML"));
  CHECK_THROWS_WITH(parse_config("[repro]\nrows = \n", {}, "broken.toml"),
                    Catch::Contains("broken.toml line 2"));
  CHECK_THROWS_WITH(load_config("/nonexistent.toml"), Catch::Contains("/nonexistent.toml"));
  CHECK_THROWS_WITH(policy_named("fixed"), Catch::Contains("deepspeed-0.16, with-mpu, exact"));
}

TEST_CASE("policies shard rows like torch.chunk and torch.tensor_split", "[repro]") {
  const seqpar::Tensor batch = seqpar::Tensor::zeros({10, 3});
  const Policy& chunk = policy_named("with-mpu");
  const Policy& split = policy_named("exact");
  CHECK(shard_rows(split, batch, 4, 3).size(0) == 2);  // 3, 3, 2, 2
  CHECK(shard_rows(split, batch, 4, 0).size(0) == 3);
  CHECK(shard_rows(chunk, seqpar::Tensor::zeros({11, 3}), 4, 3).size(0) == 2);  // 3, 3, 3, 2
  CHECK_THAT(cannot_shard_reason(chunk, 6, 4), Catch::Contains("rank 3 would have no rows"));
  CHECK(cannot_shard_reason(chunk, 10, 4).empty());  // 3, 3, 3, 1
  CHECK(cannot_shard_reason(split, 10, 4).empty());
}
