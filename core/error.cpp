#include "core/error.h"

#include <cstring>

namespace seqpar::detail {

// Paths are shortened to the part below the project root (SEQPAR_SOURCE_DIR is
// set by CMake), so messages read "nn/linear.cpp:41" from any build folder.
static const char* project_relative(const char* file) {
#ifdef SEQPAR_SOURCE_DIR
  const size_t root_length = std::strlen(SEQPAR_SOURCE_DIR);
  if (std::strncmp(file, SEQPAR_SOURCE_DIR, root_length) == 0) return file + root_length;
#endif
  return file;
}

void throw_error(const char* file, int line, const char* condition, const std::string& message) {
  std::ostringstream out;
  out << "seqpar error at " << project_relative(file) << ':' << line << ": ";
  if (condition) out << "check failed: " << condition << ": ";
  out << message;
  throw Error(out.str());
}

}  // namespace seqpar::detail
