// OutputFile: a file that appears complete or not at all.
//
//   OutputFile file(path);        // a unique temporary beside `path`
//   file.write(bytes, count);     // every write checked
//   file.commit();                // fsync, optionally read back, rename onto `path`
//
// A regular file (or a path not there yet) is written to a unique temporary in the
// same directory (so two runs never share one), fsynced and renamed into place: a
// reader sees the old file or the whole new one, and a full disk gives an error, not
// an empty file. Anything else that can be written to (a device such as /dev/null or
// /dev/full, a FIFO, /dev/stdout) is written through, never replaced by a regular
// file, and its errors are reported the same way. A symbolic link is refused (except
// the system's, under /dev and /proc): following it would let whoever planted it pick
// the file overwritten. Destroyed without commit() (an error on the way), or ended by
// SIGINT/SIGTERM (apps/common/signal_cleanup.h), the temporary is removed.
//
// Errors are seqpar::Error with the path and the system's reason ("No space left on
// device").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "apps/common/signal_cleanup.h"

namespace seqpar {

class OutputFile {
 public:
  explicit OutputFile(const std::string& path);
  // `name` created in place (O_EXCL, no link followed) in the directory `directory_fd`,
  // which only this process writes to (a dump's staging directory, removed whole on
  // failure); `shown_path` names it in errors. Removed if destroyed without commit().
  OutputFile(int directory_fd, const std::string& name, const std::string& shown_path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }

  // Makes the file durable and puts it in place. With read_back, a regular file is
  // read again before it is renamed and compared (by length and checksum) with what
  // was written, so a dump that is in place is known to be readable.
  void commit(bool read_back = false);

 private:
  void fail(const std::string& action, int error);
  void read_back();
  void remove_unfinished();

  std::string path_;       // as the user named it
  std::string name_;       // its last part, in directory_fd_
  std::string temporary_;  // empty: written through, or in place
  int directory_fd_ = -1;  // -1: written through
  int fd_ = -1;
  bool in_place_ = false, committed_ = false;
  uint64_t written_ = 0, checksum_;
  CleanupEntry cleanup_;
};

// The whole of `contents` as the file `path`, as above.
void write_output_file(const std::string& path, const std::string& contents);

// Fails (seqpar::InputError, naming `option`) when `path` cannot become an output
// file: an existing directory, a symbolic link (but the system's), a directory part
// that is missing or not a directory, or a directory where no file can be created (a
// temporary is made and removed there: read-only, no permission, a name too long).
// Used to refuse a run early rather than after its work.
void check_output_path(const std::string& option, const std::string& path);

// Creates a new file ".NAME.tmp.XXXXXX" in `directory_fd` (O_EXCL, no link followed);
// returns its descriptor, or -1 with errno. `temporary` receives its name.
int create_temporary_at(int directory_fd, const std::string& name, std::string& temporary);

}  // namespace seqpar
