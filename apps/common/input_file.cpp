#include "apps/common/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "apps/common/text.h"
#include "core/error.h"

namespace seqpar {

std::string read_input_file(const std::string& path, const std::string& option, size_t limit) {
  const std::string name = option + " " + abbreviated(path);
  // Opened, then asked what it is (not the other way round, which a swap between the two
  // would fool); O_NONBLOCK, so that opening a FIFO does not wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  SEQPAR_INPUT_CHECK(fd >= 0, name, ": cannot open: ", std::strerror(errno));
  const std::unique_ptr<int, void (*)(int*)> closing(&fd, [](int* open) { ::close(*open); });
  struct stat status {};
  SEQPAR_INPUT_CHECK(::fstat(fd, &status) == 0, name, ": cannot stat: ", std::strerror(errno));
  const mode_t mode = status.st_mode;
  SEQPAR_INPUT_CHECK(S_ISREG(mode), name, ": ", S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device" : "a socket",
                     ", not a regular file");
  std::string text;
  char buffer[16384];
  for (ssize_t count; (count = ::read(fd, buffer, sizeof buffer)) != 0;) {
    SEQPAR_INPUT_CHECK(count > 0 || errno == EINTR, name, ": cannot read: ", std::strerror(errno));
    text.append(buffer, static_cast<size_t>(std::max<ssize_t>(count, 0)));
    // Counted as it is read, so a file that grows meanwhile is held to the limit too.
    SEQPAR_INPUT_CHECK(text.size() <= limit, name, ": more than the limit of ", limit, " bytes");
  }
  return text;
}

}  // namespace seqpar
