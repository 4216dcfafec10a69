#include "core/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace seqpar {

namespace {

constexpr uint64_t kChecksumStart = 1469598103934665603ull;  // FNV-1a 64

uint64_t checksum_of(uint64_t hash, const unsigned char* bytes, size_t count) {
  for (size_t i = 0; i < count; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// /dev/stdout and the like are links into /proc whose target must be written, never
// replaced: every path under /dev or /proc is written through.
bool is_system_path(const std::string& path) {
  return path.rfind("/dev/", 0) == 0 || path.rfind("/proc/", 0) == 0;
}

[[noreturn]] void output_error(const std::string& path, const std::string& action, int error) {
  throw Error(detail::concat("cannot write ", path, ": ", action, ": ", std::strerror(error)));
}

}  // namespace

OutputFile::OutputFile(const std::string& path) : path_(path), checksum_(kChecksumStart) {
  SEQPAR_CHECK(!path.empty(), "OutputFile: empty path");
  struct stat status {};
  std::string target = path;
  mode_t mode = 0644;
  bool write_through = false;
  if (::lstat(path.c_str(), &status) == 0) {
    if (S_ISDIR(status.st_mode)) output_error(path, "open", EISDIR);
    if (S_ISLNK(status.st_mode)) {
      // A link to a regular file: that file is replaced, and the link kept.
      char resolved[PATH_MAX];
      struct stat followed {};
      const bool regular = ::realpath(path.c_str(), resolved) != nullptr &&
                           ::stat(resolved, &followed) == 0 && S_ISREG(followed.st_mode);
      write_through = is_system_path(path) || !regular;
      if (regular) target = resolved, mode = followed.st_mode & 07777;
    } else if (S_ISREG(status.st_mode)) {
      mode = status.st_mode & 07777;
    } else {
      write_through = true;  // a device, FIFO or socket
    }
  } else if (errno != ENOENT) {
    output_error(path, "stat", errno);
  }
  if (write_through) {
    // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of blocking the open.
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) output_error(path, "open", errno);
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    return;
  }
  std::string pattern = directory_of(target) + "/." + name_of(target) + ".tmp.XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) output_error(path, "create a temporary in " + directory_of(target), errno);
  temporary_ = name.data();
  path_ = target;
  if (::fchmod(fd_, mode) != 0) fail("chmod", errno);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

void OutputFile::fail(const std::string& action, int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
  output_error(path_, action, error);
}

void OutputFile::write(const void* data, size_t bytes) {
  SEQPAR_CHECK(fd_ >= 0, "OutputFile ", path_, ": write after commit or failure");
  const auto* at = static_cast<const unsigned char*>(data);
  checksum_ = checksum_of(checksum_, at, bytes);
  written_ += bytes;
  while (bytes > 0) {
    const ssize_t count = ::write(fd_, at, bytes);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) fail("write", count < 0 ? errno : EIO);
    at += count;
    bytes -= static_cast<size_t>(count);
  }
}

void OutputFile::commit(bool read_back) {
  SEQPAR_CHECK(fd_ >= 0, "OutputFile ", path_, ": commit after commit or failure");
  if (temporary_.empty()) {  // written through: the device's own close reports late errors
    const int status = ::close(fd_);
    fd_ = -1;
    if (status != 0) output_error(path_, "close", errno);
    return;
  }
  if (::fsync(fd_) != 0) fail("fsync", errno);
  if (read_back) {
    uint64_t length = 0, checksum = kChecksumStart;
    std::vector<unsigned char> buffer(1 << 16);
    for (;;) {
      const ssize_t count = ::pread(fd_, buffer.data(), buffer.size(), static_cast<off_t>(length));
      if (count < 0 && errno == EINTR) continue;
      if (count < 0) fail("read back", errno);
      if (count == 0) break;
      checksum = checksum_of(checksum, buffer.data(), static_cast<size_t>(count));
      length += static_cast<uint64_t>(count);
    }
    if (length != written_ || checksum != checksum_) fail("read back", EIO);
  }
  const int status = ::close(fd_);
  fd_ = -1;
  if (status != 0) fail("close", errno);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) fail("rename into place", errno);
  temporary_.clear();
  // The rename is durable once the directory is; a failure here loses nothing written.
  const int directory = ::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory >= 0) {
    ::fsync(directory);
    ::close(directory);
  }
}

void write_output_file(const std::string& path, const std::string& contents) {
  OutputFile file(path);
  file.write(contents);
  file.commit();
}

void check_output_path(const std::string& option, const std::string& path) {
  SEQPAR_INPUT_CHECK(!path.empty(), option, ": the path is empty");
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0) {
    SEQPAR_INPUT_CHECK(!S_ISDIR(status.st_mode), option, " ", path, ": is a directory");
    if (!S_ISREG(status.st_mode)) return;  // written through
  }
  const std::string directory = directory_of(path);
  SEQPAR_INPUT_CHECK(::stat(directory.c_str(), &status) == 0, option, " ", path, ": directory ",
                     directory, ": ", std::strerror(errno));
  SEQPAR_INPUT_CHECK(S_ISDIR(status.st_mode), option, " ", path, ": ", directory,
                     " is not a directory");
  SEQPAR_INPUT_CHECK(::access(directory.c_str(), W_OK | X_OK) == 0, option, " ", path,
                     ": cannot create files in ", directory, ": ", std::strerror(errno));
}

}  // namespace seqpar
