// What SIGINT or SIGTERM must not leave behind: temporaries and half-written outputs.
//
//   install_signal_cleanup();                   // once, in main
//   CleanupEntry entry(dir_fd, ".x.tmp.ab12cd", CleanupKind::File);
//   ...                                          // write it
//   entry.release();                             // it is in place: keep it
//
// On SIGINT or SIGTERM the handler removes every registered entry, newest first, prints
// one line and exits with 128 + the signal (130, 143), as a shell reports a program
// that a signal ended. Entries are names relative to a directory descriptor, so the
// handler never resolves a path again (a link planted meanwhile is not followed), and
// it uses only async-signal-safe calls (unlinkat, getdents64, openat, close, write).
// It runs on the thread that installed it (a signal another thread receives is passed
// on), which is the one that writes outputs: removal never races a file being created.
//
// A SignalsHeld section (renaming a finished dump into place) postpones the handler to
// the section's end, from any thread: the section's work is never cut in half.
#pragma once

namespace seqpar {

enum class CleanupKind {
  File,      // unlinked
  Directory,       // emptied (files and subdirectories, a few levels deep) and removed
  EmptyDirectory,  // removed only if empty (a directory made for an output)
};

// `program` starts the one line printed when a signal ends the process. Called from the
// thread that writes the outputs (main).
void install_signal_cleanup(const char* program);

// A registered entry; removed from the registry by release() or the destructor (which
// does not delete anything: the owner's error path does its own cleanup).
class CleanupEntry {
 public:
  CleanupEntry() = default;
  CleanupEntry(int directory_fd, const char* name, CleanupKind kind);
  ~CleanupEntry() { release(); }
  CleanupEntry(CleanupEntry&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }
  CleanupEntry& operator=(CleanupEntry&& other) noexcept;
  CleanupEntry(const CleanupEntry&) = delete;
  CleanupEntry& operator=(const CleanupEntry&) = delete;
  void release();

 private:
  int slot_ = -1;
};

// Removes a directory and its contents (a few levels deep: a dump's staging directory)
// without following links: what the handler does for CleanupKind::Directory.
void remove_directory_tree(int parent_fd, const char* name);

class SignalsHeld {
 public:
  SignalsHeld();
  ~SignalsHeld();
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;
};

}  // namespace seqpar
