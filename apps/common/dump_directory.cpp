#include "apps/common/dump_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "apps/common/text.h"
#include "core/error.h"
#include "apps/common/output_file.h"
#include "apps/common/signal_cleanup.h"

namespace seqpar {

namespace {

constexpr size_t kMaxManifestBytes = 1 << 20;
const char* const kStagingStem = "seqpar-dump";
const char* const kManifestHeader =
    "# seqpar-repro dump. --overwrite removes the files named below and no others.\n";

// A descriptor closed however the scope ends.
class Descriptor {
 public:
  explicit Descriptor(int fd = -1) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(Descriptor&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Descriptor& operator=(Descriptor&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// DIR as the user wrote it, split into its parent and its last part ("d/" is "d").
struct Location {
  std::string parent, name;
};

Location location_of(std::string directory) {
  while (directory.size() > 1 && directory.back() == '/') directory.pop_back();
  const size_t slash = directory.find_last_of('/');
  if (slash == std::string::npos) return {".", directory};
  if (directory == "/") return {"/", "."};
  return {slash == 0 ? "/" : directory.substr(0, slash), directory.substr(slash + 1)};
}

std::string folder_of(const std::string& name) {
  const size_t slash = name.find('/');
  return slash == std::string::npos ? "" : name.substr(0, slash);
}

std::string base_of(const std::string& name) { return name.substr(name.find('/') + 1); }

std::string shown(const std::string& directory, const std::string& name) {
  return printable(directory + "/" + name);
}

// A folder of DIR (or DIR itself for ""), opened without following a link.
Descriptor open_folder(int directory_fd, const std::string& folder, const std::string& directory) {
  if (folder.empty()) return Descriptor(::fcntl(directory_fd, F_DUPFD_CLOEXEC, 0));
  const int fd = ::openat(directory_fd, folder.c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 || errno == ENOENT) return Descriptor(fd);
  const int error = errno;
  struct stat status {};
  if (::fstatat(directory_fd, folder.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0) {
    // O_NOFOLLOW with O_DIRECTORY reports a link as ENOTDIR.
    SEQPAR_INPUT_CHECK(!S_ISLNK(status.st_mode), "--dump ", shown(directory, folder),
                       ": is a symbolic link; links inside a dump directory are never "
                       "followed (remove it)");
    SEQPAR_INPUT_CHECK(S_ISDIR(status.st_mode), "--dump ", shown(directory, folder),
                       ": is not a folder; a dump keeps its files there");
  }
  throw Error(detail::concat("--dump ", shown(directory, folder), ": ", std::strerror(error)));
}

std::vector<std::string> entries_of(int directory_fd) {
  std::vector<std::string> names;
  DIR* listing = ::fdopendir(::fcntl(directory_fd, F_DUPFD_CLOEXEC, 0));
  if (!listing) return names;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(listing);
  return names;
}

// The earlier dump's manifest: the names it lists; empty when there is none.
struct Earlier {
  bool has_manifest = false;
  std::vector<std::string> files;
};

Earlier read_manifest(int directory_fd, const std::string& directory) {
  const std::string path = shown(directory, kDumpManifest);
  Descriptor file(::openat(directory_fd, kDumpManifest, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0 && errno == ENOENT) return {};
  SEQPAR_INPUT_CHECK(file.get() >= 0, "--dump ", path, ": ", std::strerror(errno));
  struct stat status {};
  SEQPAR_INPUT_CHECK(::fstat(file.get(), &status) == 0 && S_ISREG(status.st_mode) &&
                         status.st_size <= static_cast<off_t>(kMaxManifestBytes),
                     "--dump ", path, ": not a regular file of at most ", kMaxManifestBytes, " bytes");
  std::string text(static_cast<size_t>(status.st_size), '\0');
  SEQPAR_INPUT_CHECK(::pread(file.get(), text.data(), text.size(), 0) == status.st_size, "--dump ",
                     path, ": cannot read: ", std::strerror(errno));
  Earlier earlier{true, {}};
  size_t line_number = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (line.empty() || line[0] == '#') continue;
    SEQPAR_INPUT_CHECK(is_dump_file_name(line), "--dump ", path, " line ", line_number, ": '",
                       printable(line), "' is not a file a dump holds; not replacing this directory");
    earlier.files.push_back(line);
  }
  return earlier;
}

// What DIR holds now, checked: refused unless a dump may be written there.
Earlier inspect(int directory_fd, const std::string& directory, bool overwrite) {
  const std::vector<std::string> entries = entries_of(directory_fd);
  if (entries.empty()) return {};
  SEQPAR_INPUT_CHECK(overwrite, "--dump ", printable(directory),
                     ": the directory is not empty (an earlier dump?); give --overwrite to "
                     "replace its dump, or name a new directory");
  Earlier earlier = read_manifest(directory_fd, directory);
  SEQPAR_INPUT_CHECK(earlier.has_manifest, "--dump ", printable(directory), ": holds files but no ",
                     kDumpManifest, ", so it is not a dump seqpar-repro wrote; --overwrite "
                     "replaces only such a dump (name a new or empty directory)");
  for (const std::string& name : earlier.files) {
    open_folder(directory_fd, folder_of(name), directory);  // refuses a folder that is a link
  }
  return earlier;
}

Descriptor open_parent(const Location& where, const std::string& directory) {
  Descriptor parent(::open(where.parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  SEQPAR_INPUT_CHECK(parent.get() >= 0, "--dump ", printable(directory), ": directory ",
                     printable(where.parent), ": ", std::strerror(errno));
  return parent;
}

// DIR's descriptor, never through a link; -1 when DIR is not there.
Descriptor open_dump_directory(int parent_fd, const Location& where, const std::string& directory) {
  const int fd = ::openat(parent_fd, where.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 || errno == ENOENT) return Descriptor(fd);
  const int error = errno;
  struct stat status {};
  const bool exists = ::fstatat(parent_fd, where.name.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0;
  SEQPAR_INPUT_CHECK(!(exists && S_ISLNK(status.st_mode)), "--dump ", printable(directory),
                     ": is a symbolic link; name the directory itself");
  SEQPAR_INPUT_CHECK(!exists || S_ISDIR(status.st_mode), "--dump ", printable(directory),
                     ": exists and is not a directory");
  SEQPAR_INPUT_FAIL("--dump ", printable(directory), ": ", std::strerror(error));
}

// Makes the staging folder, ".seqpar-dump.tmp.XXXXXX", a name no other run uses (a
// temporary file's unique name, taken over by the folder); returns its name.
std::string make_staging_folder(int directory_fd, const std::string& directory) {
  for (int attempt = 0;; ++attempt) {
    std::string name;
    const int fd = create_temporary_at(directory_fd, kStagingStem, name);
    int error = errno;
    if (fd >= 0) {
      ::close(fd);
      ::unlinkat(directory_fd, name.c_str(), 0);
      if (::mkdirat(directory_fd, name.c_str(), 0700) == 0) return name;
      error = errno;
    }
    if (error != EEXIST || attempt > 100) {
      throw Error(detail::concat("cannot write the dump in ", printable(directory), ": ",
                                 std::strerror(error)));
    }
  }
}

// Every file, then the manifest, into the staging folder; each read back.
void write_staged(int staging_fd, const std::string& directory, const std::vector<DumpFile>& files,
                  const std::map<std::string, std::string>& metadata) {
  std::map<std::string, Descriptor> folders;
  std::string manifest = kManifestHeader;
  for (const DumpFile& file : files) {
    SEQPAR_CHECK(is_dump_file_name(file.name), "dump: bad file name ", file.name);
    const std::string folder = folder_of(file.name);
    if (!folder.empty() && !folders.count(folder)) {
      if (::mkdirat(staging_fd, folder.c_str(), 0755) != 0) {
        throw Error(detail::concat("cannot write ", shown(directory, folder), ": ",
                                   std::strerror(errno)));
      }
      folders.emplace(folder, open_folder(staging_fd, folder, directory));
    }
    const int folder_fd = folder.empty() ? staging_fd : folders.at(folder).get();
    OutputFile out(folder_fd, base_of(file.name), shown(directory, file.name));
    save_safetensors(out, shown(directory, file.name), file.tensors(), metadata, true);
    manifest += file.name + "\n";
  }
  OutputFile out(staging_fd, kDumpManifest, shown(directory, kDumpManifest));
  out.write(manifest);
  out.commit(true);
}

// Before anything is replaced: every name the new dump takes is free or the earlier
// dump's, and every folder it uses is a folder (not a link, not a file).
void check_targets(int directory_fd, const std::string& directory, const std::vector<DumpFile>& files,
                   const Earlier& earlier) {
  const std::set<std::string> earlier_files(earlier.files.begin(), earlier.files.end());
  for (const DumpFile& file : files) {
    const std::string folder = folder_of(file.name);
    struct stat status {};
    if (!folder.empty() &&
        ::fstatat(directory_fd, folder.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0) {
      SEQPAR_INPUT_CHECK(S_ISDIR(status.st_mode), "--dump ", shown(directory, folder),
                         ": is not a folder (a link or a file); not replacing it");
    }
    const bool taken = ::fstatat(directory_fd, file.name.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0;
    SEQPAR_INPUT_CHECK(!taken || earlier_files.count(file.name), "--dump ",
                       shown(directory, file.name), ": exists and is not a file of the earlier "
                       "dump (its manifest does not name it); not replacing it");
  }
}

void rename_or_throw(int from_fd, int to_fd, const std::string& name, const std::string& shown_path) {
  if (::renameat(from_fd, name.c_str(), to_fd, name.c_str()) != 0) {
    throw Error(detail::concat("cannot write ", shown_path, ": rename into place: ",
                               std::strerror(errno), " (the dump in it is incomplete)"));
  }
}

// The earlier dump's files out, the new ones in: renames within one file system, with
// the signals held. The manifest goes first and comes back last, so an interrupted swap
// (power loss) leaves a directory that is not taken for a whole dump.
void swap_in(int directory_fd, int staging_fd, const std::string& directory,
             const std::vector<DumpFile>& files, const Earlier& earlier) {
  SignalsHeld held;
  ::unlinkat(directory_fd, kDumpManifest, 0);
  std::set<std::string> names, folders;
  for (const DumpFile& file : files) {
    const std::string folder = folder_of(file.name);
    names.insert(file.name);
    folders.insert(folder);
    if (!folder.empty()) ::mkdirat(directory_fd, folder.c_str(), 0755);
    const Descriptor from = open_folder(staging_fd, folder, directory);
    const Descriptor to = open_folder(directory_fd, folder, directory);
    rename_or_throw(from.get(), to.get(), base_of(file.name), shown(directory, file.name));
  }
  for (const std::string& name : earlier.files) {
    if (names.count(name)) continue;
    const Descriptor folder = open_folder(directory_fd, folder_of(name), directory);
    if (folder.get() >= 0) ::unlinkat(folder.get(), base_of(name).c_str(), 0);
  }
  for (const std::string& name : earlier.files) {
    const std::string folder = folder_of(name);
    // Removed only when empty: a user's files in it keep it.
    if (!folder.empty() && !folders.count(folder)) ::unlinkat(directory_fd, folder.c_str(), AT_REMOVEDIR);
  }
  rename_or_throw(staging_fd, directory_fd, kDumpManifest, shown(directory, kDumpManifest));
  ::fsync(directory_fd);
}

}  // namespace

bool is_dump_file_name(const std::string& name) {
  if (name.empty() || name == kDumpManifest || std::count(name.begin(), name.end(), '/') > 1) {
    return false;
  }
  for (size_t start = 0; start <= name.size();) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (part.empty() || part[0] == '.' || part.size() > 200) return false;
    for (const char c : part) {
      const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
      if (!allowed) return false;
    }
    start = end + 1;
  }
  return true;
}

void check_dump_directory(const std::string& directory, bool overwrite) {
  SEQPAR_INPUT_CHECK(!directory.empty(), "--dump: the directory name is empty");
  SEQPAR_INPUT_CHECK(directory != "-", "--dump -: a dump is a directory, it cannot go to "
                     "standard output (write ./- for a directory named '-')");
  const Location where = location_of(directory);
  const Descriptor parent = open_parent(where, directory);
  const Descriptor dump = open_dump_directory(parent.get(), where, directory);
  // Whatever would stop the dump's first file stops the run now: a temporary is made
  // and removed where it will be written.
  const int probe_in = dump.get() >= 0 ? dump.get() : parent.get();
  if (dump.get() >= 0) inspect(dump.get(), directory, overwrite);
  // Made and registered for the signal cleanup with signals held, as the staging folder
  // below: a signal between the two would leave the probe behind.
  std::string probe;
  int fd = -1;
  CleanupEntry probe_entry;
  {
    const SignalsHeld held;
    fd = create_temporary_at(probe_in, kStagingStem, probe);
    if (fd >= 0) probe_entry = CleanupEntry(probe_in, probe.c_str(), CleanupKind::File);
  }
  SEQPAR_INPUT_CHECK(fd >= 0, "--dump ", printable(directory), ": cannot create files in ",
                     printable(dump.get() >= 0 ? directory : where.parent), ": ",
                     std::strerror(errno));
  ::close(fd);
  ::unlinkat(probe_in, probe.c_str(), 0);
}

void write_dump_directory(const std::string& directory, bool overwrite,
                          const std::vector<DumpFile>& files,
                          const std::map<std::string, std::string>& metadata) {
  check_dump_directory(directory, overwrite);  // again: the run may have taken a while
  const Location where = location_of(directory);
  const Descriptor parent = open_parent(where, directory);
  // Each folder is made and registered for the signal cleanup with signals held, so that
  // a signal between the two cannot leave it behind.
  bool created = false;
  CleanupEntry created_entry;
  {
    const SignalsHeld held;
    created = ::mkdirat(parent.get(), where.name.c_str(), 0755) == 0;
    if (created) created_entry = CleanupEntry(parent.get(), where.name.c_str(), CleanupKind::EmptyDirectory);
  }
  std::string staging;
  const Descriptor dump = open_dump_directory(parent.get(), where, directory);
  try {
    SEQPAR_CHECK(dump.get() >= 0, "--dump ", printable(directory), ": vanished");
    const Earlier earlier = inspect(dump.get(), directory, overwrite);
    CleanupEntry staging_entry;
    {
      const SignalsHeld held;
      staging = make_staging_folder(dump.get(), directory);
      staging_entry = CleanupEntry(dump.get(), staging.c_str(), CleanupKind::Directory);
    }
    const Descriptor staged = open_folder(dump.get(), staging, directory);
    write_staged(staged.get(), directory, files, metadata);
    check_targets(dump.get(), directory, files, earlier);
    swap_in(dump.get(), staged.get(), directory, files, earlier);
    remove_directory_tree(dump.get(), staging.c_str());  // its emptied folders
  } catch (...) {
    // The earlier dump is as it was; this run's files go with the staging folder.
    if (!staging.empty()) remove_directory_tree(dump.get(), staging.c_str());
    if (created) ::unlinkat(parent.get(), where.name.c_str(), AT_REMOVEDIR);
    throw;
  }
}

}  // namespace seqpar
