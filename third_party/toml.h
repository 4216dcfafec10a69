// toml++, as every seqpar file includes it (never <toml++/toml.h> directly, so that all
// of them see the same definitions).
//
// toml++ 3.3 (Debian 12's) states assumptions about its input with TOML_ASSERT_ASSUME:
// an assert() in builds without NDEBUG, and under clang with NDEBUG a __builtin_assume,
// which is undefined behaviour when false. Malformed input breaks several of them ("[ =]",
// "a = [1,}]", a date with letters where its time should be), and the parser's own error
// reporting follows each one. Turning them off gives every build what GCC's release
// build does anyway: a parse error. (The one place toml++ 3.3 reaches
// __builtin_unreachable, non-ASCII whitespace, is kept away by
// apps/repro/config_formats.cpp.)
#pragma once

#include <toml++/impl/preprocessor.h>
#undef TOML_ASSERT_ASSUME
#define TOML_ASSERT_ASSUME(...) static_cast<void>(0)

#include <toml++/toml.h>
