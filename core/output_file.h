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
// file, and its errors are reported the same way. Destroyed without commit() (an error
// on the way), the temporary is removed.
//
// Errors are seqpar::Error with the path and the system's reason ("No space left on
// device").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace seqpar {

class OutputFile {
 public:
  explicit OutputFile(const std::string& path);
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

  std::string path_, temporary_;  // temporary_ empty: written through
  int fd_ = -1;
  uint64_t written_ = 0, checksum_;
};

// The whole of `contents` as the file `path`, as above.
void write_output_file(const std::string& path, const std::string& contents);

// Fails (seqpar::InputError, naming `option`) when `path` cannot become an output
// file: an existing directory, or a directory part that is missing or not a
// directory. Used to refuse a run early rather than after its work.
void check_output_path(const std::string& option, const std::string& path);

}  // namespace seqpar
