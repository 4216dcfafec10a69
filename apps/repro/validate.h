// What a configuration may hold beyond each key's own type and range (config.cpp checks
// those): the keys together, the sizes and their products, the memory and time a run
// needs. Each error is a one-line seqpar::InputError naming keys, values and limit.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "apps/repro/config.h"

namespace seqpar::repro {

// Checks that the values together describe a scenario that can run.
void validate(const ReproConfig& config);

// A generous estimate of the host memory a run takes (every rank's data, models and
// optimizer states, rank 0's records); check_memory refuses one beyond `available`,
// which available_memory_bytes reads (MemAvailable, else sysconf's free pages).
uint64_t estimated_memory_bytes(const ReproConfig& config);
void check_memory(const ReproConfig& config, uint64_t available);
std::optional<uint64_t> available_memory_bytes();

// How long a collective may wait for its last member: rank 0 alone runs the reference
// and the analysis while the others wait, and thread ranks share the cores, so a minute
// plus a second per 10^7 multiply-adds of a step over all ranks. --timeout overrides it.
std::chrono::milliseconds default_collective_timeout(const ReproConfig& config);

}  // namespace seqpar::repro
