// The policies by name: apart from policy.cpp, so that the option parser (and its fuzzing
// harness) can check a --policy name without the tensor code behind the policies.
#include "apps/repro/policy.h"

#include "core/error.h"

namespace seqpar::repro {

const std::vector<Policy>& all_policies() {
  static const std::vector<Policy> policies = {
      {PolicyKind::DeepSpeed016, "deepspeed-0.16",
       "DeepSpeed 0.16 without an mpu: gradients reduced over the mesh's data-parallel group "
       "(here each rank alone), scaled by sp/dp, clipped with each group's own norm"},
      {PolicyKind::WithMpu, "with-mpu",
       "the usual fix: an mpu whose sequence-data-parallel group spans sp x dp; gradients "
       "summed over it and divided by dp"},
      {PolicyKind::Exact, "exact",
       "rows split evenly (tensor_split), loss normalized by the global row count, the "
       "ranks' exact row sums added over sp x dp before rounding"},
  };
  return policies;
}

const Policy& policy_named(const std::string& name) {
  std::string known;
  for (const Policy& policy : all_policies()) {
    if (policy.name == name) return policy;
    known += (known.empty() ? "" : ", ") + policy.name;
  }
  SEQPAR_INPUT_FAIL("unknown policy '", name, "' (known: ", known, ", all)");
}

}  // namespace seqpar::repro
