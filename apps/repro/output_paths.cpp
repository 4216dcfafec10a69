#include "apps/repro/output_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "apps/repro/config_input.h"
#include "apps/common/dump_directory.h"
#include "core/error.h"
#include "apps/common/output_file.h"

namespace seqpar::repro {

namespace {

// Where an output lands: the file itself when it exists (a link under /dev followed, as
// the write will), else its directory and its name.
struct Place {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
  std::string name;  // when it does not exist yet
  bool operator==(const Place& other) const {
    return exists == other.exists && device == other.device && inode == other.inode &&
           name == other.name;
  }
};

std::string parent_of(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : trimmed.substr(0, slash);
}

std::string last_part(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.find_last_of('/');
  return slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
}

Place existing(const struct stat& status) { return {true, status.st_dev, status.st_ino, ""}; }

// `path` "-" is standard output.
Place place_of(const std::string& path) {
  struct stat status {};
  if (path == "-") return ::fstat(STDOUT_FILENO, &status) == 0 ? existing(status) : Place{};
  if (::stat(path.c_str(), &status) == 0) return existing(status);
  if (::stat(parent_of(path).c_str(), &status) != 0) return {false, 0, 0, path};
  return {false, status.st_dev, status.st_ino, last_part(path)};
}

bool is_dev_null(const std::string& path) {
  struct stat status {}, null {};
  return path != "-" && ::stat(path.c_str(), &status) == 0 && S_ISCHR(status.st_mode) &&
         ::stat("/dev/null", &null) == 0 && status.st_rdev == null.st_rdev;
}

// Whether the file `path` would be one of the dump's, or in one of its folders.
bool inside_dump(const std::string& path, const Place& dump) {
  if (!dump.exists) return false;
  const std::string name = last_part(path);
  const bool dump_name = name == kDumpManifest ||
                         (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
  const Place parent = place_of(parent_of(path));
  return (parent == dump && dump_name) || place_of(parent_of(parent_of(path))) == dump;
}

struct Output {
  const char* option;
  std::string path;
};

}  // namespace

void check_output_paths(const Options& options) {
  SEQPAR_INPUT_CHECK(options.plot_path != "-", "--plot -: the picture is not written to "
                     "standard output; name a file (./- for a file named '-')");
  std::vector<Output> files;
  if (!options.json_path.empty()) files.push_back({"--json", options.json_path});
  if (!options.plot_path.empty()) files.push_back({"--plot", options.plot_path});
  for (const Output& file : files) {
    if (file.path != "-") check_output_path(file.option, file.path);
  }
  if (!options.dump_directory.empty()) check_dump_directory(options.dump_directory, options.overwrite);
  for (size_t i = 0; i < files.size(); ++i) {
    for (size_t j = i + 1; j < files.size(); ++j) {
      if (is_dev_null(files[i].path) && is_dev_null(files[j].path)) continue;
      SEQPAR_INPUT_CHECK(!(place_of(files[i].path) == place_of(files[j].path)), files[i].option,
                         " ", printable(files[i].path), " and ", files[j].option, " ",
                         printable(files[j].path), " are the same file: give each its own");
    }
  }
  if (options.dump_directory.empty()) return;
  const Place dump = place_of(options.dump_directory);
  for (const Output& file : files) {
    if (file.path == "-") continue;
    SEQPAR_INPUT_CHECK(!(place_of(file.path) == dump) && !inside_dump(file.path, dump), file.option,
                       " ", printable(file.path), " and --dump ", printable(options.dump_directory),
                       " overlap: the dump's files and folders are its own; name a file elsewhere");
  }
}

}  // namespace seqpar::repro
