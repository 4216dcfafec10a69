// DeepSpeed keys the scenario does not read, and what each means for what is
// reproduced. The scenario models one thing: how gradients are synchronized over the
// sequence- and data-parallel ranks, in float32, with AdamW at a constant learning
// rate. A key that leaves that untouched (logging, monitoring, communication buckets)
// is accepted and listed in the report; one that would change the numbers (half
// precision, ZeRO-3's partitioned parameters, offload, a learning-rate schedule) is
// refused with the reason, because running without it would reproduce something
// other than what the user's config describes.
#include <map>

#include "apps/repro/config_formats.h"

namespace seqpar::repro::detail {

namespace {

KeyDecision ignore(std::string reason) { return {KeyTreatment::Ignore, std::move(reason)}; }
KeyDecision refuse(std::string reason) { return {KeyTreatment::Refuse, std::move(reason)}; }

bool is_true(const Json& node) { return node.is_boolean() && node.get<bool>(); }

// A table's member `name` as text; `fallback` when it is missing or not a string.
std::string text_of(const Json& node, const char* name, const char* fallback) {
  const Json* member = node.is_object() && node.contains(name) ? &node[name] : nullptr;
  return member && member->is_string() ? member->get<std::string>() : fallback;
}

// fp16 / bf16 / amp: a section with enabled = false changes nothing.
KeyDecision precision(const Json& node, const char* what) {
  const bool disabled = node.is_object() && node.contains("enabled") && node["enabled"] == false;
  if (disabled) return ignore("disabled");
  return refuse(std::string(what) +
                " changes every number the step computes; the scenario is float32 "
                "(set enabled: false, or remove it)");
}

KeyDecision offload(const Json& node) {
  if (text_of(node, "device", "") == "none") return ignore("device none");
  return refuse("offloading moves the optimizer step to another device and kernel, which the "
                "scenario does not model (use device: none, or remove it)");
}

KeyDecision float32_only(const Json& node) {
  const std::string type = node.is_string() ? node.get<std::string>() : "?";
  if (type == "fp32" || type == "float32") return ignore("float32, as the scenario");
  return refuse("a " + type + " reduction rounds the gradients differently; the scenario "
                "reduces in float32");
}

KeyDecision scheduler(const Json& node) {
  return refuse("a learning-rate schedule (" + text_of(node, "type", "?") +
                ") changes the learning rate each step uses, from warm-up on; the scenario "
                "steps at a constant optimizer.params.lr: remove the scheduler");
}

}  // namespace

KeyDecision deepspeed_key_decision(const std::string& key, const Json& node) {
  static const std::string logging = "logging only";
  static const std::string monitoring = "monitoring only";
  static const std::map<std::string, std::string> ignored = {
      {"ds_config.steps_per_print", logging},
      {"ds_config.wall_clock_breakdown", logging},
      {"ds_config.memory_breakdown", logging},
      {"ds_config.dump_state", logging},
      {"ds_config.comms_logger", logging},
      {"ds_config.flops_profiler", monitoring},
      {"ds_config.tensorboard", monitoring},
      {"ds_config.wandb", monitoring},
      {"ds_config.csv_monitor", monitoring},
      {"ds_config.comet", monitoring},
      {"ds_config.checkpoint", "checkpoint layout"},
      {"ds_config.activation_checkpointing",
       "recomputes activations to save memory; the same numbers"},
      {"ds_config.zero_allow_untested_optimizer", "a permission, no computation"},
      {"ds_config.optimizer.params.torch_adam", "the same AdamW update, another kernel"},
  };
  const auto found = ignored.find(key);
  if (found != ignored.end()) return ignore(found->second);

  const std::string zero = "ds_config.zero_optimization.";
  if (key == "ds_config.zero_optimization" && node.is_object()) return {KeyTreatment::Descend, ""};
  if (key == zero + "offload_optimizer" || key == zero + "offload_param") return offload(node);
  if (key.rfind(zero, 0) == 0) {
    return ignore("communication tuning: when gradients move, not over which ranks");
  }
  if (key == "ds_config.fp16") return precision(node, "fp16");
  if (key == "ds_config.bf16") return precision(node, "bf16");
  if (key == "ds_config.amp") return precision(node, "amp");
  if (key == "ds_config.scheduler") return scheduler(node);
  if (key == "ds_config.communication_data_type" ||
      key == "ds_config.seq_parallel_communication_data_type") {
    return float32_only(node);
  }
  if (key == "ds_config.optimizer.params.adam_w_mode") {
    if (is_true(node)) return ignore("true: decoupled weight decay, AdamW");
    return refuse("Adam with L2 weight decay in the gradient is not modelled; the scenario "
                  "is AdamW (adam_w_mode: true, DeepSpeed's default)");
  }
  if (key == "ds_config.prescale_gradients") {
    if (node == false) return ignore("false: DeepSpeed's default");
    return refuse("prescaling divides the gradients before the reduction; the scenario "
                  "models DeepSpeed's default (false)");
  }
  if (key == "ds_config.gradient_predivide_factor") {
    if (node.is_number() && node.get<double>() == 1.0) {
      return ignore("1.0: DeepSpeed's default");
    }
    return refuse("a predivide factor rescales the gradients around the reduction; the "
                  "scenario models DeepSpeed's default (1.0)");
  }
  return {};
}

}  // namespace seqpar::repro::detail
