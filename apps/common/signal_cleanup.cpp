#include "apps/common/signal_cleanup.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace seqpar {

namespace {

// A slot is free (0), being filled or emptied (1), or holds an entry (2). The handler
// reads only slots that hold one.
struct Slot {
  std::atomic<int> state{0};
  int directory_fd = -1;
  CleanupKind kind = CleanupKind::File;
  char name[256] = {};
};

constexpr int kSlots = 64;
Slot slots[kSlots];
const char* program_name = "seqpar";
std::atomic<int> held_sections{0};
std::atomic<int> pending_signal{0};
pthread_t main_thread;

constexpr int kMostLevels = 4;  // a staging directory, a policy's folder, their files

bool remove_tree(int parent_fd, const char* name, int levels_left);

// Removes what `directory_fd` holds; returns false when something could not go.
bool empty_directory(int directory_fd, int levels_left) {
  alignas(8) char buffer[4096];
  for (;;) {  // entries are read again from the start until a pass finds none
    ::lseek(directory_fd, 0, SEEK_SET);
    const long bytes = ::syscall(SYS_getdents64, directory_fd, buffer, sizeof buffer);
    if (bytes < 0) return false;
    bool removed = false, any = false;
    for (long at = 0; at < bytes;) {
      // linux_dirent64: u64 inode, s64 offset, u16 record length, u8 type, name.
      unsigned short length;
      std::memcpy(&length, buffer + at + 16, sizeof length);
      const char* name = buffer + at + 19;
      at += length;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      any = true;
      if (::unlinkat(directory_fd, name, 0) == 0) {
        removed = true;
      } else if ((errno == EISDIR || errno == EPERM) && levels_left > 0) {
        removed = remove_tree(directory_fd, name, levels_left - 1) || removed;
      }
    }
    if (!any) return true;
    if (!removed) return false;
  }
}

// Returns whether the directory is gone.
bool remove_tree(int parent_fd, const char* name, int levels_left) {
  const int directory_fd =
      ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (directory_fd < 0) return false;
  empty_directory(directory_fd, levels_left);
  ::close(directory_fd);
  return ::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0;
}

void remove_registered() {
  for (int i = kSlots - 1; i >= 0; --i) {
    Slot& slot = slots[i];
    if (slot.state.load() != 2) continue;
    switch (slot.kind) {
      case CleanupKind::File:
        ::unlinkat(slot.directory_fd, slot.name, 0);
        break;
      case CleanupKind::Directory:
        remove_tree(slot.directory_fd, slot.name, kMostLevels);
        break;
      case CleanupKind::EmptyDirectory:
        ::unlinkat(slot.directory_fd, slot.name, AT_REMOVEDIR);
        break;
    }
  }
}

void write_text(const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {
    const ssize_t count = ::write(STDERR_FILENO, text, left);
    if (count <= 0) return;
    text += count;
    left -= static_cast<size_t>(count);
  }
}

[[noreturn]] void end_by_signal(int signal) {
  remove_registered();
  write_text(program_name);
  write_text(signal == SIGINT ? ": interrupted (SIGINT)" : ": terminated (SIGTERM)");
  write_text("; unfinished output removed\n");
  ::_exit(128 + signal);
}

void on_signal(int signal) {
  // Outputs are written by the main thread: the cleanup runs there, where it is not
  // racing the writing of the next file (the kernel may pick any thread for a signal).
  if (!pthread_equal(pthread_self(), main_thread)) {
    pthread_kill(main_thread, signal);
    return;
  }
  if (held_sections.load() > 0) {
    pending_signal.store(signal);
    return;
  }
  end_by_signal(signal);
}

}  // namespace

void install_signal_cleanup(const char* program) {
  program_name = program;
  main_thread = pthread_self();
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  for (const int signal : {SIGINT, SIGTERM}) {
    struct sigaction previous {};
    // A signal ignored by whoever started us (nohup, a shell's background job) stays so.
    if (::sigaction(signal, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) continue;
    ::sigaction(signal, &action, nullptr);
  }
}

void remove_directory_tree(int parent_fd, const char* name) {
  remove_tree(parent_fd, name, kMostLevels);
}

CleanupEntry::CleanupEntry(int directory_fd, const char* name, CleanupKind kind) {
  SEQPAR_CHECK(std::strlen(name) < sizeof(Slot::name), "CleanupEntry: name too long: ", name);
  for (int i = 0; i < kSlots; ++i) {
    int free = 0;
    if (!slots[i].state.compare_exchange_strong(free, 1)) continue;
    slots[i].directory_fd = directory_fd;
    slots[i].kind = kind;
    std::strcpy(slots[i].name, name);
    slots[i].state.store(2);
    slot_ = i;
    return;
  }
  SEQPAR_FAIL("CleanupEntry: more than ", kSlots, " outputs in progress");
}

CleanupEntry& CleanupEntry::operator=(CleanupEntry&& other) noexcept {
  if (this != &other) {
    release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void CleanupEntry::release() {
  if (slot_ < 0) return;
  slots[slot_].state.store(0);
  slot_ = -1;
}

SignalsHeld::SignalsHeld() { held_sections.fetch_add(1); }

SignalsHeld::~SignalsHeld() {
  if (held_sections.fetch_sub(1) == 1) {
    const int signal = pending_signal.exchange(0);
    if (signal != 0) end_by_signal(signal);
  }
}

}  // namespace seqpar
