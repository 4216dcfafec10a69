// The diagnosis in plain words (print_diagnosis) and as JSON (diagnosis_json, schema
// seqpar-diagnose/1, described in apps/diagnose/README.md).
#pragma once

#include <ostream>
#include <string>

#include "apps/diagnose/diagnosis.h"

namespace seqpar::diagnose {

void print_diagnosis(std::ostream& out, const RunFiles& run, const Settings& settings, const Diagnosis& diagnosis);
std::string diagnosis_json(const RunFiles& run, const Settings& settings, const Diagnosis& diagnosis);

}  // namespace seqpar::diagnose
