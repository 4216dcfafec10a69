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

// An error that has no single condition to name (an unknown option, a bad key).
#define SEQPAR_FAIL(...)                                                           \
  ::seqpar::detail::throw_error(__FILE__, __LINE__, nullptr,                       \
                                ::seqpar::detail::concat(__VA_ARGS__))
