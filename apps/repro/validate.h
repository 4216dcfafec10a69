// What a configuration may hold beyond each key's own type and range (config.cpp checks
// those): the keys taken together, the sizes and their products, and the memory and time
// a run needs. Each error is a seqpar::InputError of one line naming the keys, values
// and limit (seqpar-repro exits 2 on it).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "apps/repro/config.h"

namespace seqpar::repro {

// Checks that the values together describe a scenario that can run.
void validate(const ReproConfig& config);

// A generous estimate of the host memory a run takes (all ranks' copies of the data,
// the models and optimizer states, rank 0's records); check_memory fails when it
// exceeds `available`, which available_memory_bytes reads (MemAvailable in
// /proc/meminfo, else sysconf's free pages; nullopt when neither can be read).
uint64_t estimated_memory_bytes(const ReproConfig& config);
void check_memory(const ReproConfig& config, uint64_t available);
std::optional<uint64_t> available_memory_bytes();

// How long a collective may wait for its last member. Rank 0 alone runs the one-rank
// reference and the analysis of each step while the others wait at the next
// collective, and ranks that are threads share the cores, so the wait grows with the
// work of a step over all ranks: a minute plus a second for every 10^7 multiply-adds
// (a rate far below any machine's). --timeout overrides it.
std::chrono::milliseconds default_collective_timeout(const ReproConfig& config);

}  // namespace seqpar::repro
