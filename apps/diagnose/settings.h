// The run's optimizer and mesh settings, from the flags, the user's ds_config, or the
// configuration seqpar-repro stores in its dumps' metadata, in that order of precedence.
//
// A DeepSpeed JSON config is read for the few keys the diagnosis uses and nothing more
// (read_ds_config): optimizer.type and optimizer.params (lr, betas, eps, weight_decay),
// gradient_clipping, sequence_parallel_size, data_parallel_size, and bf16.enabled and
// fp16.enabled for the precision the tolerances derive from. Every other key (scheduler, zero_optimization, offload, batch sizes, "auto" values) is accepted
// unread. Keys left out take DeepSpeed's defaults: clipping 0 (off); Adam's lr 1e-3,
// betas 0.9, 0.999, eps 1e-8, weight decay 0 (DeepSpeed's FusedAdam). Without an
// optimizer section the optimizer is the client's and its numbers are unknown. sp and
// dp come from the flags, or the number of rank files, when the config has none.
// "auto" (the Hugging Face Trainer fills it in) on the lr, which every tolerance is
// derived from, asks for --lr; on the other keys it leaves them unknown, said so. A top-level key one or two letters from a key it reads is refused as a
// likely typo. seqpar's own TOML or YAML configs are read as seqpar-repro reads them.
#pragma once

#include <optional>
#include <string>

#include "apps/diagnose/diagnosis.h"

namespace seqpar::diagnose {

struct SettingFlags {
  std::optional<double> lr, beta1, beta2, eps, weight_decay, clipping;
  std::optional<int> sp, dp;
  std::optional<Precision> precision;  // --precision: overrides the dtypes and the config
  std::optional<int64_t> tokens;       // --tokens: the batch's tokens (a gradient's sum length)
  std::optional<AttentionLayout> attention_layout;  // --attention-layout
  std::string ds_config;  // a path, or empty
};

// What a DeepSpeed JSON config says: each setting known or not, the "auto" ones by the
// flag that must replace them, and a line on where each came from.
struct DeepSpeedSettings {
  Settings settings;
  bool lr_is_auto = false;  // then --lr must be given
  // "bf16": {"enabled": true} or "fp16": {"enabled": true} (DeepSpeed's mixed precision;
  // "auto" counts as not known); nullopt: float32 as far as the config says.
  std::optional<Precision> precision;
};
DeepSpeedSettings read_ds_config(const std::string& text, const std::string& path);

// Fails (InputError) when sp x dp does not match the number of rank files (one rank's
// files alone are accepted: only the baseline can be compared then). The precision is
// --precision, else the coarsest of the saved dtypes and the config's bf16 / fp16.
Settings resolve_settings(const SettingFlags& flags, const RunFiles& run);

}  // namespace seqpar::diagnose
