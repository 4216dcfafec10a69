#include "apps/common/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
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

const char* const kLinkRefused =
    "is a symbolic link; outputs are never written through a link nor onto its target "
    "(remove the link, or name the file itself)";

// Six letters that differ between calls and between processes.
std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  uint64_t x = (uint64_t(::getpid()) << 40) ^ uint64_t(now.tv_nsec) ^ (counter.fetch_add(1) << 20);
  x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15ull;
  std::string suffix;
  for (int i = 0; i < 6; ++i, x /= 36) suffix += "abcdefghijklmnopqrstuvwxyz0123456789"[x % 36];
  return suffix;
}

}  // namespace

int create_temporary_at(int directory_fd, const std::string& name, std::string& temporary) {
  // The name's head only: the temporary's name must fit where the output's does.
  const std::string stem = "." + name.substr(0, 200) + ".tmp.";
  for (int attempt = 0; attempt < 100; ++attempt) {
    temporary = stem + unique_suffix();
    const int fd = ::openat(directory_fd, temporary.c_str(),
                            O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

OutputFile::OutputFile(const std::string& path) : path_(path), checksum_(kChecksumStart) {
  SEQPAR_CHECK(!path.empty(), "OutputFile: empty path");
  struct stat status {};
  mode_t mode = 0644;
  bool write_through = false;
  if (::lstat(path.c_str(), &status) == 0) {
    if (S_ISDIR(status.st_mode)) output_error(path, "open", EISDIR);
    if (S_ISLNK(status.st_mode) && !is_system_path(path)) {
      throw Error(detail::concat("cannot write ", path, ": it ", kLinkRefused));
    }
    if (S_ISREG(status.st_mode)) {
      mode = status.st_mode & 07777;
    } else {
      write_through = true;  // a device, FIFO or socket, or a link under /dev or /proc
    }
  } else if (errno != ENOENT) {
    output_error(path, "stat", errno);
  }
  if (write_through) {
    // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of blocking the open.
    // O_NOFOLLOW unless the name is a system link: a link planted since lstat is refused.
    const int follow = S_ISLNK(status.st_mode) ? 0 : O_NOFOLLOW;
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC | follow);
    if (fd_ < 0) output_error(path, "open", errno);
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    return;
  }
  // The temporary and the rename are relative to the directory's descriptor, and rename
  // replaces the name itself: a link planted at `path` meanwhile is replaced, not followed.
  const std::string directory = directory_of(path);
  directory_fd_ = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd_ < 0) output_error(path, "open directory " + directory, errno);
  name_ = name_of(path);
  {
    // Made and registered for the signal cleanup with signals held: a signal between
    // the two cannot leave the temporary behind.
    const SignalsHeld held;
    fd_ = create_temporary_at(directory_fd_, name_, temporary_);
    if (fd_ >= 0) cleanup_ = CleanupEntry(directory_fd_, temporary_.c_str(), CleanupKind::File);
  }
  if (fd_ < 0) {
    temporary_.clear();
    output_error(path, "create a temporary in " + directory, errno);
  }
  if (::fchmod(fd_, mode) != 0) fail("chmod", errno);
}

OutputFile::OutputFile(int directory_fd, const std::string& name, const std::string& shown_path)
    : path_(shown_path), name_(name), checksum_(kChecksumStart) {
  directory_fd_ = ::fcntl(directory_fd, F_DUPFD_CLOEXEC, 0);
  if (directory_fd_ < 0) output_error(path_, "dup", errno);
  fd_ = ::openat(directory_fd_, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                 0644);
  if (fd_ < 0) output_error(path_, "create", errno);
  in_place_ = true;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  remove_unfinished();
  if (directory_fd_ >= 0) ::close(directory_fd_);
}

void OutputFile::remove_unfinished() {
  if (!temporary_.empty()) ::unlinkat(directory_fd_, temporary_.c_str(), 0);
  if (in_place_ && !committed_) ::unlinkat(directory_fd_, name_.c_str(), 0);
  temporary_.clear();
  in_place_ = false;
  cleanup_.release();
}

void OutputFile::fail(const std::string& action, int error) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  remove_unfinished();
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

void OutputFile::read_back() {
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

void OutputFile::commit(bool read_back) {
  SEQPAR_CHECK(fd_ >= 0, "OutputFile ", path_, ": commit after commit or failure");
  if (directory_fd_ < 0) {  // written through: the device's own close reports late errors
    const int status = ::close(fd_);
    fd_ = -1;
    if (status != 0) output_error(path_, "close", errno);
    return;
  }
  if (::fsync(fd_) != 0) fail("fsync", errno);
  if (read_back) this->read_back();
  const int status = ::close(fd_);
  fd_ = -1;
  if (status != 0) fail("close", errno);
  if (!in_place_) {
    if (::renameat(directory_fd_, temporary_.c_str(), directory_fd_, name_.c_str()) != 0) {
      fail("rename into place", errno);
    }
    temporary_.clear();
  }
  committed_ = true;
  cleanup_.release();
  // The file's name is durable once the directory is; a failure here loses nothing written.
  ::fsync(directory_fd_);
}

void write_output_file(const std::string& path, const std::string& contents) {
  OutputFile file(path);
  file.write(contents);
  file.commit();
}

void check_output_path(const std::string& option, const std::string& path) {
  SEQPAR_INPUT_CHECK(!path.empty(), option, ": the path is empty");
  struct stat status {};
  if (::lstat(path.c_str(), &status) == 0) {
    SEQPAR_INPUT_CHECK(!S_ISDIR(status.st_mode), option, " ", path, ": is a directory");
    if (S_ISLNK(status.st_mode)) {
      SEQPAR_INPUT_CHECK(is_system_path(path), option, " ", path, ": ", kLinkRefused);
      SEQPAR_INPUT_CHECK(::access(path.c_str(), W_OK) == 0, option, " ", path, ": ",
                         std::strerror(errno));
      return;  // written through
    }
    if (!S_ISREG(status.st_mode)) {
      SEQPAR_INPUT_CHECK(::access(path.c_str(), W_OK) == 0, option, " ", path, ": ",
                         std::strerror(errno));
      return;  // written through
    }
  } else {
    SEQPAR_INPUT_CHECK(errno == ENOENT, option, " ", path, ": ", std::strerror(errno));
  }
  // A temporary made and removed where the file will be written: whatever would stop
  // the real one (a missing or read-only directory, a name too long) stops the run now.
  const std::string directory = directory_of(path);
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  SEQPAR_INPUT_CHECK(directory_fd >= 0, option, " ", path, ": directory ", directory, ": ",
                     std::strerror(errno));
  std::string temporary;
  const int fd = create_temporary_at(directory_fd, name_of(path), temporary);
  const int error = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlinkat(directory_fd, temporary.c_str(), 0);
  }
  ::close(directory_fd);
  SEQPAR_INPUT_CHECK(fd >= 0, option, " ", path, ": cannot create files in ", directory, ": ",
                     std::strerror(error));
}

}  // namespace seqpar
