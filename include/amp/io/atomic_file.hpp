#pragma once
// Writes a file all at once or not at all: the text goes to a temporary file
// beside the target, which is renamed over it only when complete. A crash or a
// full disk never leaves a half-written result.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "amp/core/error.hpp"

namespace amp::io {

inline void write_file_atomically(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  AMP_REQUIRE(f, "cannot write '", path, "': ", std::strerror(errno));
  const bool written = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(errno), " (nothing was changed)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(err), " (nothing was changed)");
  }
}

}  // namespace amp::io
