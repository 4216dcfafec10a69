#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "apps/repro/config.h"
#include "apps/repro/config_input.h"
#include "apps/repro/validate.h"
#include "apps/repro/policy.h"
#include "apps/repro/scenario_list.h"
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
  CHECK(file.adamw.lr() == 1e-4);
  CHECK(file.adamw.beta2() == 0.999);
  CHECK(file.rows == 12000);
  // The TOML it prints reads back to the same configuration.
  CHECK(to_toml(parse_config(to_toml(file), {}, "round trip")) == to_toml(file));
}

TEST_CASE("overrides (--set) reach any key with a TOML value", "[repro][config]") {
  const ReproConfig config = with({"repro.rows=1001", "ds_config.optimizer.params.lr=3e-4",
                                   "ds_config.optimizer.params.betas=[0.8, 0.9]",
                                   "ds_config.data_parallel_size=2", "ds_config.gradient_clipping=0"});
  CHECK(config.rows == 1001);
  CHECK(config.adamw.lr() == 3e-4);
  CHECK(config.adamw.beta1() == 0.8);
  CHECK(config.world_size() == 8);
  CHECK(config.gradient_clipping == 0);
}

TEST_CASE("bad configurations name the key and the value", "[repro][config][errors]") {
  CHECK_THROWS_WITH(with({"repro.colums=3"}), Catch::Contains("unknown config key repro.colums"));
  CHECK_THROWS_WITH(with({"ds_config.zero_optimization.stage=3"}),
                    Catch::Contains("ds_config.zero_optimization.stage = 3"));
  CHECK_THROWS_WITH(with({"ds_config.zero_optimization.stage=4"}),
                    Catch::Contains("ds_config.zero_optimization.stage = 4"));
  // The zero-stage scenario models stage 3's reduction, and keeps the stage on a round trip.
  const ReproConfig zero3 = with({"ds_config.zero_optimization.stage=3", "repro.scenario=\"zero-stage\""});
  CHECK(zero3.zero_stage == 3);
  CHECK(parse_config(to_toml(zero3), {}, "round trip").zero_stage == 3);
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

TEST_CASE("every config error is an InputError of one line naming key, value and limit",
          "[repro][config][errors]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"repro.rows=4611686018427387904", "overflows"},
      {"ds_config.data_parallel_size=4611686018427387904", "world size"},
      {"ds_config.sequence_parallel_size=2000", "at most 1024"},
      {"repro.steps=1000000000000", "repro.steps = 1000000000000: must be at most 1000000"},
      {"ds_config.optimizer.params.lr=1e39", "lr = 1e+39: not representable in float32"},
      {"ds_config.optimizer.params.lr=2", "lr = 2: must be in (0, 1]"},
      {"ds_config.optimizer.params.lr=1e-50", "not representable in float32"},
      {"ds_config.optimizer.params.lr=nan", "lr = nan: must be a finite number"},
      {"ds_config.optimizer.params.eps=inf", "eps = inf: must be a finite number"},
      // an integer past 2^53, which toml++ does not turn into a double (found by fuzz_config)
      {"ds_config.optimizer.params.eps=4611686018427387904", "eps must be a number a double holds exactly"},
      {"ds_config.gradient_clipping=-9007199254740993", "gradient_clipping must be a number a double"},
      {"ds_config.gradient_predivide_factor=4611686018427387904", "predivide factor"},
      {"ds_config.optimizer.params.weight_decay=inf", "weight_decay = inf"},
      {"ds_config.gradient_clipping=inf", "gradient_clipping = inf"},
      {"ds_config.gradient_clipping=-1", "gradient_clipping = -1: must be in [0, "},
      {"ds_config.optimizer.params.betas=[0.9, 0.99999999]", "rounds to 1"},
      {"ds_config.optimizer.params.betas=[nan, 0.9]", "betas[0] = nan"},
      {"repro.=3", "the key is not TOML"},
      {"repro.", "expected section.key=value"},
      {".rows=3", "the key is not TOML"},
      {"repro..rows=3", "the key is not TOML"},
      {"repro.rows=64\n[repro]\nseed = 5", "control characters"},
      {"repro.rows={}", "must be an integer"},
      {"repro.'rows=3", "the key is not TOML"},
  };
  for (const auto& [assignment, expected] : cases) {
    INFO(assignment);
    try {
      parse_config("", {assignment}, "test");
      FAIL("accepted");
    } catch (const seqpar::InputError& error) {
      const std::string message = error.what();
      CHECK_THAT(message, Catch::Contains(expected));
      CHECK(message.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("sizes: products checked, memory estimated, timeouts scaled", "[repro][config]") {
  CHECK_THROWS_WITH(with({"repro.in_features=4294967296", "repro.out_features=4294967296"}),
                    Catch::Contains("repro.out_features x repro.in_features = 4294967296 x 4294967296"));
  const ReproConfig defaults = with({});
  CHECK(estimated_memory_bytes(defaults) > 4 * 12000 * 640 * 4);  // every rank's inputs
  CHECK(estimated_memory_bytes(defaults) < (1ull << 30));
  CHECK_NOTHROW(check_memory(defaults, 1ull << 30));
  const ReproConfig huge = with({"repro.rows=100000000"});
  CHECK_THROWS_AS(check_memory(huge, 64ull << 30), seqpar::InputError);
  CHECK_THROWS_WITH(check_memory(huge, 64ull << 30),
                    Catch::Contains("GiB of memory") && Catch::Contains("repro.rows = 100000000"));
  CHECK(available_memory_bytes().value_or(1) > 0);
  CHECK(default_collective_timeout(defaults) >= std::chrono::seconds(60));
  CHECK(default_collective_timeout(with({"repro.rows=1200000"})) >
        default_collective_timeout(defaults) + std::chrono::seconds(600));
}

TEST_CASE("override (--set) keys honour TOML quotes", "[repro][config]") {
  CHECK(with({"repro.\"rows\"=1001"}).rows == 1001);
  CHECK(with({" repro . \"rows\" =1001"}).rows == 1001);
  CHECK_THROWS_WITH(with({"repro.'a.b'=1"}), Catch::Contains("config key \"a.b\" in repro has a '.' in its name"));
  CHECK_THROWS_WITH(with({"repro.\"\"=1"}), Catch::Contains("unknown config key repro."));
  CHECK_THROWS_WITH(with({"repro rows=1"}), Catch::Contains("--set repro rows=1: the key is not TOML"));
}

TEST_CASE("config text is checked before the TOML parser reads it", "[repro][config][errors]") {
  const auto rejects = [](const std::string& text, const std::string& expected) {
    INFO(text);
    CHECK_THROWS_AS(parse_config(text, {}, "t.toml"), seqpar::InputError);
    CHECK_THROWS_WITH(parse_config(text, {}, "t.toml"), Catch::Contains(expected));
  };
  rejects("a = 1\xEF\xB8\x8F\n", "U+FE0F");                // toml++ 3.3's unreachable branch
  rejects("x = \"\"\"\\\t\xEF\xB8\x8F\"\"\"\n", "U+FE0F");  // ... also inside a string
  rejects("a = 1 \xE2\x80\x83\n", "character U+2003 is not accepted");  // toml++ 3.3: whitespace
  rejects("[repro]\nrows = \xff\n", "not valid UTF-8 (byte 0xFF)");
  rejects("a = \"\xed\xa0\x80\"\n", "not valid UTF-8");          // a surrogate
  rejects("[ =\"\"[repro]\n", "t.toml line 1 column 3");        // toml++ asserted here
  rejects("[repro]\nrows = 1979-05-27T07:32:00Z\n", "repro.rows must be an integer, got \"1979-05-27T07:32:00Z\"");
  rejects("[repro]\nrows = 1979-05-27Tbe:32:00Z\n", "line 2 column 19: Error while parsing time");
  rejects("a = --help\"caf\xe2\x80\x94\"\n", "t.toml line 1 column 6");
  // Non-ASCII where TOML allows it: in strings and comments.
  CHECK_THROWS_WITH(parse_config("a = \"caf\xe2\x80\x94\" # \xe2\x80\x94\n", {}, "t.toml"),
                    Catch::Contains("unknown config key a"));
  CHECK_NOTHROW(parse_config("# \xe2\x80\x94 a comment\n[repro]\nrows = 64\n", {}, "t.toml"));
  CHECK_THROWS_WITH(parse_config("x = [\n  [1, 2],\n]\n", {}, "t.toml"),
                    Catch::Contains("unknown config key x"));  // an array, not a table header
}

TEST_CASE("config files (--config): regular files of bounded size only", "[repro][config][errors]") {
  CHECK_THROWS_WITH(load_config("/tmp"), Catch::Contains("/tmp: a directory, not a regular file"));
  CHECK_THROWS_WITH(load_config("/dev/zero"), Catch::Contains("a character device"));
  const std::string fifo = "/tmp/seqpar_config_test_fifo";
  std::remove(fifo.c_str());
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(load_config(fifo), Catch::Contains("a FIFO"));  // used to block
  std::remove(fifo.c_str());
  const std::string big = "/tmp/seqpar_config_test_big.toml";
  std::ofstream(big) << std::string(kMaxConfigBytes + 1, '#');
  CHECK_THROWS_WITH(load_config(big), Catch::Contains("more than the limit"));
  std::remove(big.c_str());
  CHECK_THROWS_AS(load_config("/nonexistent.toml"), seqpar::InputError);
}

TEST_CASE("a scenario's defaults are its config file; a user's config is read over them",
          "[repro][config]") {
  // Every scenario named by repro.scenario starts from configs/<its file>, whatever else
  // the text holds.
  for (const ScenarioConfig& scenario : scenario_configs()) {
    const ReproConfig named = parse_config("", {std::string("repro.scenario=\"") + scenario.scenario + "\""}, "t");
    CHECK(to_toml(named) == to_toml(load_config(std::string(SEQPAR_SOURCE_DIR) + scenario.file)));
  }
  CHECK(parse_config("", {"repro.scenario=\"clipping-norms\""}, "t").gradient_clipping == 0.1);
  CHECK(parse_config("", {"repro.scenario=\"masked-tokens\""}, "t").gradient_accumulation_steps == 4);
  // A user's file: what it leaves out is listed, what it sets is not.
  const ReproConfig mine = parse_users_config("[ds_config]\ngradient_clipping = 0.5\n", {"repro.rows=64"},
                                              "mine.toml", ConfigFormat::Toml);
  CHECK(mine.gradient_clipping == 0.5);
  auto taken = [&](const std::string& key) {
    for (const std::string& entry : mine.taken_from_scenario) {
      if (entry.rfind(key + " = ", 0) == 0) return true;
    }
    return false;
  };
  CHECK(taken("ds_config.sequence_parallel_size"));
  CHECK(taken("ds_config.optimizer.params.lr"));
  CHECK_FALSE(taken("ds_config.gradient_clipping"));
  CHECK_FALSE(taken("repro.rows"));  // given by --set
  CHECK_FALSE(taken("repro.scenario"));
  CHECK(parse_config("[ds_config]\ngradient_clipping = 0.5\n", {}, "t").taken_from_scenario.empty());
  CHECK_THROWS_WITH(parse_users_config("# nothing\n", {}, "empty.toml", ConfigFormat::Toml),
                    Catch::Contains("empty.toml holds no settings"));
}

TEST_CASE("every refusal of a config is reported at once", "[repro][config]") {
  const std::string text = "[ds_config]\ngradient_clipping = \"auto\"\nsequence_parallel_size = \"auto\"\n"
                           "[repro]\nrows = 1.5\n";
  CHECK_THROWS_WITH(parse_config(text, {}, "hf.toml"),
                    Catch::StartsWith("config hf.toml: 3 settings refused: (1) ") &&
                        Catch::Contains("ds_config.gradient_clipping = \"auto\": a placeholder") &&
                        Catch::Contains("ds_config.sequence_parallel_size = \"auto\"") &&
                        Catch::Contains("repro.rows must be an integer"));
}

TEST_CASE("train_batch_size is DeepSpeed's product of the batch sizes", "[repro][config]") {
  CHECK(parse_config("", {"ds_config.train_batch_size=4"}, "t").train_batch_size == 4);
  CHECK(parse_config("", {"ds_config.train_batch_size=16", "ds_config.data_parallel_size=2",
                          "ds_config.train_micro_batch_size_per_gpu=8"}, "t").train_batch_size == 16);
  CHECK_THROWS_WITH(parse_config("", {"ds_config.train_batch_size=8"}, "t"),
                    Catch::Contains("DeepSpeed requires train_micro_batch_size_per_gpu 4 x "
                                    "gradient_accumulation_steps 1 x data_parallel_size 1 = 4"));
}

TEST_CASE("overrides take a bare word as a string, and floats print in their shortest form",
          "[repro][config]") {
  CHECK(parse_config("", {"ds_config.optimizer.type=adamw"}, "t").optimizer_type == "AdamW");
  CHECK_THROWS_WITH(parse_config("", {"ds_config.optimizer.type=SGD"}, "t"), Catch::Contains("\"SGD\""));
  CHECK_THROWS_WITH(parse_config("", {"repro.rows=[1,"}, "t"), Catch::Contains("not TOML"));
  CHECK(shortest_float_text(0.9) == "0.9");
  CHECK(shortest_float_text(1e-4) == "1e-4");
  CHECK(shortest_float_text(1.0) == "1.0");
  CHECK(shortest_float_text(5e8) == "5e8");
  CHECK(shortest_float_text(0.1 + 0.2) == "0.30000000000000004");
  for (const double value : {0.9, 0.999, 1e-8, 3e-4, 0.123456789012345678, 1e300, 5e-324}) {
    CHECK(std::strtod(shortest_float_text(value).c_str(), nullptr) == value);
  }
  const std::string toml = to_toml(parse_config("", {}, "t"));
  CHECK_THAT(toml, Catch::Contains("betas = [0.9, 0.999]") && Catch::Contains("lr = 1e-4") &&
                       !Catch::Contains("0000000"));
}
