// DeepSpeed keys the scenario does not read. It models how gradients are synchronized
// over the sequence- and data-parallel ranks, in float32, with AdamW at a constant
// learning rate: a key that leaves that untouched (logging, communication buckets) is
// accepted and listed in the report; one that would change the numbers (half precision,
// offload, a schedule) is refused with the reason, since without it the run would
// reproduce something other than what the config describes.
#include <algorithm>
#include <map>
#include <vector>

#include "apps/common/text.h"
#include "apps/repro/config_formats.h"

namespace seqpar::repro::detail {

namespace {

// A key that is harmless only at some values: accepted at those (`accepted` says why),
// refused at any other (`refused` says why).
struct Rule {
  const char* member;          // the member of the key's table that decides ("enabled"), or null: the value itself
  std::vector<Json> harmless;  // the values at which it changes nothing
  const char* accepted;
  const char* refused;
};

const std::map<std::string, Rule>& rules() {
  static const Rule precision{"enabled", {false}, "disabled", "lower precision changes every number the step "
                              "computes; the scenario is float32 (set enabled: false, or remove it)"};
  static const Rule offload{"device", {"none"}, "device none", "offloading moves the optimizer step to another "
                            "device and kernel, which the scenario does not model (use device: none, or remove it)"};
  static const Rule reduction{nullptr, {"fp32", "float32"}, "float32, as the scenario", "a reduction in another "
                              "type rounds the gradients differently; the scenario reduces in float32"};
  static const std::map<std::string, Rule> table = {
      {"ds_config.fp16", precision}, {"ds_config.bf16", precision}, {"ds_config.amp", precision},
      {"ds_config.zero_optimization.offload_optimizer", offload},
      {"ds_config.zero_optimization.offload_param", offload},
      {"ds_config.communication_data_type", reduction},
      {"ds_config.seq_parallel_communication_data_type", reduction},
      {"ds_config.optimizer.params.adam_w_mode", {nullptr, {true}, "true: decoupled weight decay, AdamW", "Adam with "
       "L2 weight decay in the gradient is not modelled; the scenario is AdamW (adam_w_mode: true, DeepSpeed's "
       "default)"}},
      {"ds_config.prescale_gradients", {nullptr, {false}, "false: DeepSpeed's default", "prescaling divides the "
       "gradients before the reduction; the scenario models DeepSpeed's default (false)"}},
      {"ds_config.gradient_predivide_factor", {nullptr, {1.0}, "1.0: DeepSpeed's default", "a predivide factor "
       "rescales the gradients around the reduction; the scenario models DeepSpeed's default (1.0)"}},
  };
  return table;
}

}  // namespace

KeyDecision deepspeed_key_decision(const std::string& key, const Json& node) {
  static const std::map<std::string, std::string> ignored = {
      {"ds_config.steps_per_print", "logging only"}, {"ds_config.wall_clock_breakdown", "logging only"},
      {"ds_config.memory_breakdown", "logging only"}, {"ds_config.dump_state", "logging only"},
      {"ds_config.comms_logger", "logging only"}, {"ds_config.flops_profiler", "monitoring only"},
      {"ds_config.tensorboard", "monitoring only"}, {"ds_config.wandb", "monitoring only"},
      {"ds_config.csv_monitor", "monitoring only"}, {"ds_config.comet", "monitoring only"},
      {"ds_config.checkpoint", "checkpoint layout"},
      {"ds_config.activation_checkpointing", "recomputes activations to save memory; the same numbers"},
      {"ds_config.zero_allow_untested_optimizer", "a permission, no computation"},
      {"ds_config.optimizer.params.torch_adam", "the same AdamW update, another kernel"},
  };
  if (const auto found = ignored.find(key); found != ignored.end()) return {KeyTreatment::Ignore, found->second};
  if (const auto found = rules().find(key); found != rules().end()) {
    const Rule& rule = found->second;
    const Json value = !rule.member ? node : node.is_object() ? node.value(rule.member, Json()) : Json();
    // nlohmann compares numbers by value: 1 == 1.0, but true != 1.
    const bool harmless = std::count(rule.harmless.begin(), rule.harmless.end(), value) > 0;
    return {harmless ? KeyTreatment::Ignore : KeyTreatment::Refuse, harmless ? rule.accepted : rule.refused};
  }
  if (key == "ds_config.scheduler") {
    const Json type = node.is_object() ? node.value("type", Json("?")) : Json("?");
    return {KeyTreatment::Refuse, "a learning-rate schedule (" + abbreviated(type.is_string() ? type.get<std::string>()
            : type.dump()) + ") changes the learning rate each step uses, from warm-up on; the scenario steps at a "
            "constant optimizer.params.lr: remove the scheduler"};
  }
  if (key == "ds_config.zero_optimization" && node.is_object()) return {KeyTreatment::Descend, ""};
  if (key.rfind("ds_config.zero_optimization.", 0) == 0) {
    return {KeyTreatment::Ignore, "communication tuning: when gradients move, not over which ranks"};
  }
  return {};
}

}  // namespace seqpar::repro::detail
