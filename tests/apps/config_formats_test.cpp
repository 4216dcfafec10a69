// The user's own configs: the bug report's config.yaml and DeepSpeed's ds_config.json
// read into the same scenario as configs/issue6868.toml; DeepSpeed keys that do not
// change the scenario accepted and listed, those that would change it refused.
#include <catch2/catch.hpp>

#include <algorithm>

#include "apps/repro/config.h"
#include "apps/repro/config_formats.h"
#include "core/error.h"

using namespace seqpar::repro;

namespace {

const std::string kConfigs = std::string(SEQPAR_SOURCE_DIR) + "configs/";

bool lists(const ReproConfig& config, const std::string& key) {
  return std::any_of(config.ignored.begin(), config.ignored.end(),
                     [&](const ConfigNote& note) { return note.key.rfind(key, 0) == 0; });
}

ReproConfig json(const std::string& text) {
  return parse_config(text, {}, "test.json", ConfigFormat::Json);
}

ReproConfig yaml(const std::string& text) {
  return parse_config(text, {}, "test.yaml", ConfigFormat::Yaml);
}

}  // namespace

TEST_CASE("the report's config.yaml is the built-in scenario", "[repro][config]") {
  const ReproConfig toml = load_config(kConfigs + "issue6868.toml");
  const ReproConfig report = load_config(kConfigs + "issue6868.yaml");
  CHECK(to_toml(report) == to_toml(toml));
  CHECK(report.adamw.lr() == 1e-4);  // `lr: 1e-4` is a number, as OmegaConf reads it
  CHECK(report.adamw.eps() == 1e-8);
  // The micro-batch size alone: the report's script feeds x whole.
  REQUIRE(report.ignored.size() == 1);
  CHECK(report.ignored[0].key == "ds_config.train_micro_batch_size_per_gpu = 4");
}

TEST_CASE("a DeepSpeed ds_config.json is the built-in scenario", "[repro][config]") {
  const ReproConfig config = load_config(kConfigs + "ds_config.json");
  ReproConfig expected = load_config(kConfigs + "issue6868.toml");
  expected.train_batch_size = 4;  // the JSON's, which DeepSpeed checks
  CHECK(to_toml(config) == to_toml(expected));
  CHECK(lists(config, "ds_config.steps_per_print = 10"));
  CHECK(lists(config, "ds_config.wall_clock_breakdown"));
  CHECK(config.train_batch_size == 4);  // checked against micro-batch x accumulation x dp
  CHECK(lists(config, "ds_config.zero_optimization.stage = 2"));
  CHECK(lists(config, "ds_config.zero_optimization.reduce_bucket_size"));
  CHECK(lists(config, "ds_config.fp16"));
  CHECK_FALSE(lists(config, "ds_config.sequence_parallel_size"));
}

TEST_CASE("the format follows the extension, else the content", "[repro][config]") {
  CHECK(config_format_for("a.toml", "{") == ConfigFormat::Toml);
  CHECK(config_format_for("a.yml", "") == ConfigFormat::Yaml);
  CHECK(config_format_for("a.json", "x: 1") == ConfigFormat::Json);
  CHECK(config_format_for("config", "# c\n  {\"lr\": 1}") == ConfigFormat::Json);
  CHECK(config_format_for("config", "\n[ds_config]\n") == ConfigFormat::Toml);
  CHECK(config_format_for("config", "steps = 2 # a: b") == ConfigFormat::Toml);
  CHECK(config_format_for("config", "ds_config:\n  lr: 1") == ConfigFormat::Yaml);
}

TEST_CASE("YAML scalars are typed as OmegaConf types them", "[repro][config]") {
  const ReproConfig config = yaml(
      "ds_config:\n  gradient_clipping: 5e-1\n  sequence_parallel_size: 2\n"
      "  optimizer: {type: AdamW, params: {lr: .5e-3, betas: [0.8, 0.9]}}\n"
      "  steps_per_print: ~\n"
      "repro: {rows: 1_000}\n"
      "model_name: mlp\n");
  CHECK(config.gradient_clipping == 0.5);
  CHECK(config.sequence_parallel_size == 2);
  CHECK(config.adamw.lr() == 0.5e-3);
  CHECK(config.adamw.beta1() == 0.8);
  CHECK(config.rows == 1000);
  CHECK(lists(config, "model_name"));                 // outside ds_config: not read
  CHECK(lists(config, "ds_config.steps_per_print"));  // null: DeepSpeed's default
  // Quoted, a number is a string, as in OmegaConf.
  CHECK_THROWS_WITH(yaml("ds_config: {gradient_clipping: '1.0'}"),
                    Catch::Contains("gradient_clipping must be a number") &&
                        Catch::Contains("\"1.0\""));
  CHECK_THROWS_WITH(yaml("ds_config:\n  lr: [1\n"), Catch::Contains("test.yaml line"));
  CHECK_THROWS_AS(yaml("- 1\n- 2\n"), seqpar::InputError);
}

TEST_CASE("JSON: DeepSpeed keys at the top, or under ds_config", "[repro][config]") {
  CHECK(json(R"({"sequence_parallel_size": 2, "gradient_clipping": 0})").sequence_parallel_size == 2);
  const ReproConfig nested = json(R"({"ds_config": {"sequence_parallel_size": 2}, "seed": 1})");
  CHECK(nested.sequence_parallel_size == 2);
  CHECK(lists(nested, "seed"));
  // --set still reaches any key, whatever the file's format.
  CHECK(parse_config(R"({"sequence_parallel_size": 2})", {"repro.rows=10"}, "t.json",
                     ConfigFormat::Json).rows == 10);
  CHECK_THROWS_WITH(json("{\"lr\": }"), Catch::Contains("test.json"));
  CHECK_THROWS_AS(json("[1, 2]"), seqpar::InputError);
}

TEST_CASE("keys that would change the result are refused with the reason",
          "[repro][config][errors]") {
  auto refused = [](const std::string& text, const std::string& key, const std::string& why) {
    CHECK_THROWS_WITH(json(text), Catch::Contains(key) && Catch::Contains(why));
    CHECK_THROWS_AS(json(text), seqpar::InputError);
  };
  refused(R"({"fp16": {"enabled": true}})", "ds_config.fp16", "float32");
  refused(R"({"bf16": {"enabled": true}})", "ds_config.bf16", "float32");
  refused(R"({"zero_optimization": {"stage": 3}})", "zero_optimization.stage = 3", "partitions");
  refused(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})",
          "offload_optimizer", "offloading");
  refused(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})",
          "ds_config.scheduler", "WarmupLR");
  refused(R"({"prescale_gradients": true})", "prescale_gradients", "prescaling");
  refused(R"({"communication_data_type": "fp16"})", "communication_data_type", "fp16");
  // Unknown keys stay errors, so a typo is never dropped.
  CHECK_THROWS_WITH(json(R"({"sequence_paralel_size": 4})"),
                    Catch::Contains("unknown config key ds_config.sequence_paralel_size"));
  // The same keys, harmless, are accepted.
  const ReproConfig accepted = json(
      R"({"zero_optimization": {"stage": 0, "offload_param": {"device": "none"}},
          "prescale_gradients": false, "gradient_predivide_factor": 1.0,
          "communication_data_type": "fp32"})");
  CHECK(accepted.ignored.size() == 6);  // and the scenario's micro-batch size
}

TEST_CASE("optimizer names as DeepSpeed matches them", "[repro][config]") {
  CHECK(json(R"({"optimizer": {"type": "adamw"}})").optimizer_type == "AdamW");
  const ReproConfig adam = json(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})");
  CHECK(adam.optimizer_type == "AdamW");
  CHECK(lists(adam, "ds_config.optimizer.type = \"Adam\""));
  CHECK(lists(adam, "ds_config.optimizer.params.adam_w_mode = true"));
  CHECK_THROWS_WITH(json(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"),
                    Catch::Contains("adam_w_mode = false") && Catch::Contains("L2"));
  CHECK_THROWS_WITH(json(R"({"optimizer": {"type": "Lamb"}})"), Catch::Contains("\"Lamb\""));
}

TEST_CASE("YAML plain scalars follow OmegaConf's patterns, case by case", "[repro][config]") {
  const auto kind = [](const std::string& text) {
    const auto node = detail::typed_plain_scalar(text, "test");
    if (node.is_null()) return std::string("null");
    return std::string(node.is_number_integer() ? "integer" : node.is_number_float() ? "float"
                       : node.is_boolean() ? "bool" : "string");
  };
  for (const char* text : {"0", "12", "-3", "+4_000", "0x1F", "-0x_a"}) CHECK(kind(text) == "integer");
  for (const char* text : {"1e-4", "1.", ".5", "-2.5E+3", "1_0.0_1", ".inf", "-.Inf", ".NaN"}) {
    INFO(text);
    CHECK(kind(text) == "float");
  }
  for (const char* text : {"yes", "Off", "TRUE"}) CHECK(kind(text) == "bool");
  for (const char* text : {"~", "null", ""}) CHECK(kind(text) == "null");
  // YAML 1.1 has no octal-looking decimals or bare exponents; these stay text.
  for (const char* text : {"012", "1e", "e5", "1.2.3", "0x", "._", "inf", "nan", "1e4x"}) {
    INFO(text);
    CHECK(kind(text) == "string");
  }
  CHECK(kind("99999999999999999999") == "string");  // beyond int64: the key's reader names it
  CHECK(kind(std::string(200, 'a')) == "string");   // long text that is no number
  CHECK_THROWS_WITH(kind(std::string(101, '1')), Catch::Contains("a number of 101 characters"));
}

TEST_CASE("hostile YAML and JSON end in an InputError naming file, line and limit", "[repro][config]") {
  const auto yaml_error = [](const std::string& text) {
    try {
      yaml(text);
    } catch (const seqpar::InputError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(yaml_error("ds_config: &x {a: *x}\n"),
             Catch::Contains("test.yaml line 1") && Catch::Contains("limit of 64 levels"));
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char level = 'b'; level <= 'g'; ++level) {
    laughs += std::string(1, level) + ": &" + level + " [";
    for (int i = 0; i < 10; ++i) laughs += std::string(i ? ", *" : "*") + char(level - 1);
    laughs += "]\n";
  }
  CHECK_THAT(yaml_error(laughs + "ds_config: {}\n"), Catch::Contains("limit of 100000 values"));
  CHECK_THAT(yaml_error("repro:\n  rows: " + std::string(5000, '7') + "\n"),
             Catch::Contains("line 2") && Catch::Contains("a number of 5000 characters"));
  CHECK_THAT(yaml_error("repro: {rows: 1, rows: 2}\n"), Catch::Contains("duplicate key repro.rows"));
  CHECK_THAT(yaml_error("repro: {rows: 64}\n---\nrepro: {rows: 65}\n"),
             Catch::Contains("line 2: a second YAML document"));
  CHECK_THAT(yaml_error("repro:\n  rows: !!str 64\n"), Catch::Contains("must be an integer"));
  CHECK_THAT(yaml_error("repro:\n  rows: !!python/int 64\n"), Catch::Contains("is not supported"));
  CHECK(yaml("repro:\n  rows: !!int 64\n  dropout: !!float 0\n").rows == 64);
  CHECK_THAT(yaml_error("ds_config:\n  \"optimizer.params.lr\": 0.5\n"), Catch::Contains("'.' in its name"));
  CHECK_THROWS_WITH(json(std::string("{\"repro\": {\"rows\": 64}}\0{\"x\": 1}", 33)),
                    Catch::Contains("line 1 column 24: a control character (byte 0x00)"));
  CHECK_THROWS_WITH(json(std::string(70, '[') + std::string(70, ']')),
                    Catch::Contains("test.json: nested deeper than the limit of 64"));
  CHECK_THROWS_WITH(json("{\"repro\": {\"rows\": 1, \"rows\": 2}}"), Catch::Contains("duplicate key \"rows\""));
  CHECK_THROWS_WITH(json("{\"repro\": {\"rows\": 18446744073709551615}}"),
                    Catch::StartsWith("config key repro.rows ="));
  CHECK_THROWS_WITH(json("{\"lr\": 1e400}"), Catch::StartsWith("config test.json: number overflow"));
}
