#pragma once
// What every example does around its training: result files checked before
// training and written all or nothing, and an interrupt (SIGINT, SIGTERM) that
// stops after the current step, keeps what finished and exits with the signal.
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <amp/io/file.hpp>

namespace examples {

namespace detail {
inline std::atomic<int> caught_signal{0};
inline sigset_t interrupt_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace detail

// Catches SIGINT and SIGTERM from now on; the training loops poll interrupted(),
// and a second signal ends the process at once. Call it first in main, before
// any thread starts: the signals are blocked in this thread and in every thread
// started later (OpenMP's, MPI's), and one watcher thread takes them with
// sigwait. No handler ever interrupts other code, which matters: oneDNN 2.x's
// JIT GEMM points rsp into the heap while it runs, so a signal frame pushed
// there corrupts the heap (oneDNN issue #4845).
inline void watch_interrupts() {
  const sigset_t set = detail::interrupt_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (detail::caught_signal.exchange(sig) != 0) {  // the second one: die by it now
        std::signal(sig, SIG_DFL);
        pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
        std::raise(sig);
      }
    }
  }).detach();
}

inline bool interrupted() { return detail::caught_signal.load(std::memory_order_relaxed) != 0; }

// Ends the process as the signal would have (exit status 128 + signal).
[[noreturn]] inline void exit_by_signal() {
  const int sig = detail::caught_signal;
  std::fflush(nullptr);  // the signal ends the process without flushing stdio
  std::signal(sig, SIG_DFL);
  std::raise(sig);  // pending while blocked in this thread: unblocking delivers it
  const sigset_t set = detail::interrupt_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  std::_Exit(128 + sig);
}

// The result files of a run, by flag: checked before training, written together.
class Outputs {
 public:
  // A flag and its path; an empty path writes nothing.
  void add(std::string flag, std::string path) {
    if (!path.empty()) {
      amp::io::check_writable(path, flag);
      files_.push_back({std::move(flag), std::move(path)});
    }
  }
  bool wants(const std::string& flag) const {
    for (const auto& f : files_)
      if (f.flag == flag) return true;
    return false;
  }
  // contents(flag) gives each file's text; all are written or none.
  template <class Contents>
  void write(Contents&& contents, bool quiet = false) const {
    amp::io::FileSet set;
    for (const auto& f : files_) set.add(f.path, contents(f.flag));
    set.commit();
    if (!quiet)
      for (const auto& f : files_) std::printf("wrote %s\n", f.path.c_str());
  }

 private:
  struct File {
    std::string flag, path;
  };
  std::vector<File> files_;
};

}  // namespace examples
