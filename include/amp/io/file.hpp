#pragma once
// Writing result files so that nothing is ever half-written or clobbered:
// - a regular (or new) file is written to a temporary file beside it, flushed
//   to disk and renamed over it, so a crash leaves the old file or the new one;
// - a symbolic link is followed, and its target written the same way (the
//   link stays a link);
// - a special file (a device such as /dev/null or /dev/full, a pipe,
//   /dev/stdout) is written directly, and its write errors are reported.
// check_writable() asks the same questions without writing, so a program can
// refuse a bad output path before it spends hours training. FileSet writes
// several files all or nothing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/core/error.hpp"

namespace amp::io {

namespace detail {
inline std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The file a path finally names: symbolic links followed (at most 40, as the kernel).
inline std::string resolve_links(std::string path) {
  for (int depth = 0; depth < 40; ++depth) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
    std::string target(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 4096), '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    AMP_REQUIRE(n > 0, "cannot follow the link '", path, "': ", std::strerror(errno));
    target.resize(static_cast<std::size_t>(n));
    path = target.front() == '/' ? target : folder_of(path) + "/" + target;
  }
  fail("cannot follow the link '", path, "': too many levels of symbolic links");
}

// Where a write to `path` goes: a special file is opened by its own name (the
// link /dev/stdout leads to a pipe with no name), anything else at the file
// the links lead to, so the rename replaces the target and keeps the link.
struct Destination {
  std::string path;
  bool special = false;
};

inline Destination destination(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return {path, true};
  return {resolve_links(path), false};
}

inline void write_all(int fd, std::string_view contents, const std::string& path) {
  std::size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    AMP_REQUIRE(n > 0, "cannot write '", path, "': ", std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

// A temporary file beside `target`, removed unless committed.
class Staged {
 public:
  Staged(std::string target, std::string_view contents) : target_(std::move(target)) {
    static int counter = 0;
    const std::string folder = folder_of(target_);
    tmp_ = folder + "/." + target_.substr(target_.find_last_of('/') + 1) + ".tmp-" + std::to_string(::getpid()) +
           "-" + std::to_string(counter++);
    const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    AMP_REQUIRE(fd >= 0, "cannot write '", target_, "': ", std::strerror(errno));
    struct stat old {};
    if (::stat(target_.c_str(), &old) == 0) ::fchmod(fd, old.st_mode & 07777);  // keep the file's permissions
    try {
      write_all(fd, contents, target_);
      AMP_REQUIRE(::fsync(fd) == 0, "cannot write '", target_, "': ", std::strerror(errno));
    } catch (...) {
      ::close(fd);
      ::unlink(tmp_.c_str());
      throw;
    }
    AMP_REQUIRE(::close(fd) == 0, "cannot write '", target_, "': ", std::strerror(errno));
  }
  Staged(Staged&& o) noexcept : target_(std::move(o.target_)), tmp_(std::exchange(o.tmp_, {})) {}
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;
  ~Staged() {
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
  }

  void commit() {
    AMP_REQUIRE(::rename(tmp_.c_str(), target_.c_str()) == 0, "cannot write '", target_, "': ", std::strerror(errno));
    tmp_.clear();
    // The rename itself reaches the disk with the folder.
    const int dir = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }

 private:
  std::string target_, tmp_;
};
}  // namespace detail

// Refuses, without writing anything, a path that write_file could not write:
// a missing or read-only folder, a folder in place of a file, a read-only file.
inline void check_writable(const std::string& path, std::string_view what = "output") {
  AMP_REQUIRE(!path.empty(), what, ": empty file name");
  const detail::Destination dest = detail::destination(path);
  struct stat st {};
  if (::stat(dest.path.c_str(), &st) == 0) {
    AMP_REQUIRE(!S_ISDIR(st.st_mode), what, " '", path, "' is a folder, not a file");
    AMP_REQUIRE(::access(dest.path.c_str(), W_OK) == 0, what, " '", path, "' cannot be written: ",
                std::strerror(errno));
    if (dest.special) return;  // a device or pipe is written in place
  }
  const std::string folder = detail::folder_of(dest.path);
  AMP_REQUIRE(::stat(folder.c_str(), &st) == 0 && S_ISDIR(st.st_mode), what, " '", path, "': the folder '", folder,
              "' does not exist");
  AMP_REQUIRE(::access(folder.c_str(), W_OK | X_OK) == 0, what, " '", path, "': the folder '", folder,
              "' cannot be written: ", std::strerror(errno));
}

// Several files, written all or nothing: each is staged when added, and
// commit() renames them into place only once every one has been written.
// Special files cannot be staged; they are written at commit, after the rest.
class FileSet {
 public:
  void add(const std::string& path, std::string_view contents) {
    detail::Destination dest = detail::destination(path);
    if (dest.special) special_.emplace_back(std::move(dest.path), std::string(contents));
    else staged_.emplace_back(std::move(dest.path), contents);
  }

  void commit() {
    for (auto& s : staged_) s.commit();
    staged_.clear();
    for (const auto& [target, contents] : special_) {
      const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
      AMP_REQUIRE(fd >= 0, "cannot write '", target, "': ", std::strerror(errno));
      try {
        detail::write_all(fd, contents, target);
      } catch (...) {
        ::close(fd);
        throw;
      }
      AMP_REQUIRE(::close(fd) == 0, "cannot write '", target, "': ", std::strerror(errno));
    }
    special_.clear();
  }

 private:
  std::vector<detail::Staged> staged_;
  std::vector<std::pair<std::string, std::string>> special_;
};

// One file: atomically if regular, directly if special (see the top of this file).
inline void write_file(const std::string& path, std::string_view contents) {
  FileSet set;
  set.add(path, contents);
  set.commit();
}

}  // namespace amp::io
