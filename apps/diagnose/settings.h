// The run's optimizer and mesh settings, from the flags, the user's ds_config, or the
// configuration seqpar-repro stores in its dumps' metadata, in that order of precedence.
//
// A DeepSpeed JSON config is read for the few keys the diagnosis uses and nothing more
// (read_ds_config): optimizer.type and optimizer.params (lr, betas, eps, weight_decay),
// gradient_clipping, sequence_parallel_size, data_parallel_size. Every other key (bf16,
// fp16, scheduler, zero_optimization, offload, batch sizes, "auto" values) is accepted
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
  std::string ds_config;  // a path, or empty
};

// What a DeepSpeed JSON config says: each setting known or not, the "auto" ones by the
// flag that must replace them, and a line on where each came from.
struct DeepSpeedSettings {
  Settings settings;
  bool lr_is_auto = false;  // then --lr must be given
};
DeepSpeedSettings read_ds_config(const std::string& text, const std::string& path);

// Fails (InputError) when sp x dp does not match the number of rank files (one rank's
// files alone are accepted: only the baseline can be compared then).
Settings resolve_settings(const SettingFlags& flags, const RunFiles& run);

}  // namespace seqpar::diagnose
