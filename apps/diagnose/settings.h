// The run's optimizer and mesh settings, from the flags, the user's ds_config (read as
// seqpar-repro reads one: apps/repro/config.h), or the configuration seqpar-repro
// stores in its dumps' metadata, in that order of precedence.
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

// Fails (InputError) when sp x dp does not match the number of rank files (one rank's
// files alone are accepted: only the reference can be compared then).
Settings resolve_settings(const SettingFlags& flags, const RunFiles& run);

}  // namespace seqpar::diagnose
