// The error family every layer uses.
//
// A failed check throws seqpar::Error whose message names the condition, the
// file:line where it was checked, and a message built from the offending values:
//
//   SEQPAR_CHECK(x.dim() == 2, "linear: x must be 2-D, got shape ", x.shape());
//   -> "seqpar error at nn/linear.cpp:41: check failed: x.dim() == 2:
//       linear: x must be 2-D, got shape [3, 4, 5]"
//
// CUDA_CHECK, CURAND_CHECK and NCCL_CHECK (core/cuda_check.h, dist/nccl_check.h)
// are built on the same helper and add the failing call's text.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace seqpar {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// What the user gave was wrong: an option, a config key or value, a file. The message
// is written for that user (it names the option or key, the value and the limit) and
// carries no file:line, because nothing inside seqpar failed. Programs exit 2 on it,
// the convention for usage errors, and 1 on any other Error.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what) {}
};

namespace detail {

// Streams any value; vectors print as [a, b, c] so shapes read naturally.
template <typename T>
void stream_value(std::ostringstream& out, const T& value) {
  out << value;
}
template <typename T>
void stream_value(std::ostringstream& out, const std::vector<T>& values) {
  out << '[';
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
}

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (stream_value(out, args), ...);
  return out.str();
}

[[noreturn]] void throw_error(const char* file, int line, const char* condition,
                              const std::string& message);

}  // namespace detail
}  // namespace seqpar

#define SEQPAR_CHECK(cond, ...)                                                    \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      ::seqpar::detail::throw_error(__FILE__, __LINE__, #cond,                     \
                                    ::seqpar::detail::concat(__VA_ARGS__));        \
    }                                                                              \
  } while (0)

// The user's input is wrong (see InputError): SEQPAR_INPUT_CHECK(steps >= 1, "--steps ", s,
// ": must be at least 1"). The message alone is thrown, without the condition's text.
#define SEQPAR_INPUT_CHECK(cond, ...)                                              \
  do {                                                                             \
    if (!(cond)) throw ::seqpar::InputError(::seqpar::detail::concat(__VA_ARGS__)); \
  } while (0)

#define SEQPAR_INPUT_FAIL(...) throw ::seqpar::InputError(::seqpar::detail::concat(__VA_ARGS__))

// An error that has no single condition to name (an unknown option, a bad key).
#define SEQPAR_FAIL(...)                                                           \
  ::seqpar::detail::throw_error(__FILE__, __LINE__, nullptr,                       \
                                ::seqpar::detail::concat(__VA_ARGS__))
