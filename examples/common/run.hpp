#pragma once
// What every example does around its training: result files checked before
// training and written all or nothing, and an interrupt (SIGINT, SIGTERM) that
// stops after the current step, keeps what finished and exits with the signal.
#include <csignal>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <amp/io/file.hpp>

namespace examples {

namespace detail {
inline volatile std::sig_atomic_t caught_signal = 0;
extern "C" inline void on_interrupt(int sig) { caught_signal = sig; }
}  // namespace detail

// Catches SIGINT and SIGTERM from now on; the training loops poll interrupted().
inline void watch_interrupts() {
  struct sigaction action {};
  action.sa_handler = detail::on_interrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

inline bool interrupted() { return detail::caught_signal != 0; }

// Ends the process as the signal would have (exit status 128 + signal).
[[noreturn]] inline void exit_by_signal() {
  const int sig = detail::caught_signal;
  std::fflush(nullptr);  // the signal ends the process without flushing stdio
  std::signal(sig, SIG_DFL);
  std::raise(sig);
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
