#include "apps/diagnose/settings.h"

#include "apps/repro/config.h"
#include "apps/repro/config_input.h"
#include "core/error.h"

namespace seqpar::diagnose {

namespace {

void take(const repro::ReproConfig& config, Settings& settings) {
  settings.lr = config.adamw.lr();
  settings.beta1 = config.adamw.beta1();
  settings.beta2 = config.adamw.beta2();
  settings.eps = config.adamw.eps();
  settings.weight_decay = config.adamw.weight_decay();
  settings.clipping = config.gradient_clipping;
  settings.sp = int(config.sequence_parallel_size);
  settings.dp = int(config.data_parallel_size);
}

}  // namespace

Settings resolve_settings(const SettingFlags& flags, const RunFiles& run) {
  Settings settings;
  const auto metadata = run.ranks[0].metadata.find("config");
  if (!flags.ds_config.empty()) {
    try {
      take(repro::load_config(flags.ds_config), settings);
    } catch (const InputError& error) {
      // seqpar-repro refuses what it cannot reproduce (half precision, schedulers, ...),
      // which the diagnosis does not need: the flags carry the few numbers it does.
      SEQPAR_INPUT_FAIL("--ds-config: ", error.what(), " (or give --lr, --betas, --sp and --dp instead)");
    }
    settings.sources.push_back("optimizer and mesh from " + flags.ds_config +
                               " (as seqpar-repro reads it: keys left out take the bug report's values)");
  } else if (metadata != run.ranks[0].metadata.end() && run.ranks[0].metadata.count("producer") &&
             run.ranks[0].metadata.at("producer") == "seqpar-repro") {
    take(repro::parse_config(metadata->second, {}, run.ranks[0].files[0] + " (metadata)"), settings);
    settings.sources.push_back("optimizer and mesh from seqpar-repro's configuration in " + run.ranks[0].files[0]);
  }
  std::string given;
  const auto set = [&](const char* flag, std::optional<double>& target, const std::optional<double>& value) {
    if (!value) return;
    target = value;
    given += (given.empty() ? "" : ", ") + std::string(flag);
  };
  set("lr", settings.lr, flags.lr);
  set("beta1", settings.beta1, flags.beta1);
  set("beta2", settings.beta2, flags.beta2);
  set("eps", settings.eps, flags.eps);
  set("weight decay", settings.weight_decay, flags.weight_decay);
  set("gradient clipping", settings.clipping, flags.clipping);
  if (flags.sp) settings.sp = *flags.sp;
  if (flags.dp) settings.dp = *flags.dp;
  if (flags.sp) given += (given.empty() ? "" : ", ") + std::string("sp");
  if (flags.dp) given += (given.empty() ? "" : ", ") + std::string("dp");
  if (!given.empty()) settings.sources.push_back("from the command line: " + given);
  const int ranks = int(run.ranks.size());
  if (settings.sp == 0 && settings.dp == 0) {
    settings.sp = ranks;
    settings.dp = 1;
    if (ranks > 1) settings.sources.push_back("assumed sp " + std::to_string(ranks) + " x dp 1 (one rank file each; --sp and --dp say otherwise)");
  } else if (settings.sp == 0) {
    SEQPAR_INPUT_CHECK(ranks % settings.dp == 0 || ranks == 1, "dp ", settings.dp, ": ", ranks,
                       " rank file(s) are not a multiple of it (missing ranks?)");
    if (ranks == 1) settings.sp = 1;
    if (ranks > 1) settings.sp = ranks / settings.dp;
  } else if (settings.dp == 0) {
    SEQPAR_INPUT_CHECK(ranks % settings.sp == 0 || ranks == 1, "sp ", settings.sp, ": ", ranks,
                       " rank file(s) are not a multiple of it (missing ranks?)");
    settings.dp = ranks == 1 ? 1 : ranks / settings.sp;
  }
  SEQPAR_INPUT_CHECK(ranks == 1 || settings.sp * settings.dp == ranks, "sp ", settings.sp, " x dp ", settings.dp,
                     " = ", settings.sp * settings.dp, " ranks, but --ranks names ", ranks,
                     " file(s) (missing ranks, or give --sp and --dp)");
  if (!settings.lr) {
    settings.sources.push_back("no lr (--lr or --ds-config): the 2 lr signature is not checked");
  }
  return settings;
}

}  // namespace seqpar::diagnose
