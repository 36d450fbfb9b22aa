#pragma once
// IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or raw, read
// through zlib (gzread passes raw files through unchanged). Every header field
// is checked and the payload must have exactly the length the header promises:
// a truncated, oversized or malformed file is an amp::Error naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include <zlib.h>

#include "amp/core/error.hpp"

namespace amp::data {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;
  std::int64_t count() const { return dims.empty() ? 0 : dims[0]; }
};

namespace detail {
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    AMP_REQUIRE(f_, "cannot open IDX file '", path, "'");
    gzbuffer(f_, 1 << 17);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() { gzclose(f_); }

  // Reads up to n bytes; fewer only at the end of the data.
  std::size_t read(void* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(f_, static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(f_, &err);
        fail("IDX file '", path_, "': read error: ", msg);
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile f_;
};
}  // namespace detail

// Reads an IDX file of unsigned bytes (type 0x08) with `expected_rank` dimensions.
inline IdxArray read_idx(const std::string& path, int expected_rank) {
  detail::GzFile f(path);
  std::uint8_t magic[4];
  AMP_REQUIRE(f.read(magic, 4) == 4, "IDX file '", path, "' is truncated: no 4-byte header");
  AMP_REQUIRE(magic[0] == 0 && magic[1] == 0, "IDX file '", path, "' has a bad magic number (first bytes ",
              int(magic[0]), " ", int(magic[1]), ", expected 0 0): not an IDX file");
  AMP_REQUIRE(magic[2] == 0x08, "IDX file '", path, "' holds element type 0x", std::hex, int(magic[2]), std::dec,
              "; only unsigned bytes (0x08) are supported");
  AMP_REQUIRE(magic[3] == expected_rank, "IDX file '", path, "' has ", int(magic[3]), " dimensions, expected ",
              expected_rank);
  IdxArray out;
  std::uint64_t total = 1;
  for (int d = 0; d < expected_rank; ++d) {
    std::uint8_t b[4];
    AMP_REQUIRE(f.read(b, 4) == 4, "IDX file '", path, "' is truncated inside its header");
    const std::int64_t n = (std::int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
    AMP_REQUIRE(n > 0 && n < (1 << 28), "IDX file '", path, "': dimension ", d, " is ", n);
    out.dims.push_back(n);
    total *= static_cast<std::uint64_t>(n);
  }
  AMP_REQUIRE(total <= (std::uint64_t{1} << 32), "IDX file '", path, "' claims ", total, " values: too large");
  out.values.resize(static_cast<std::size_t>(total));
  const std::size_t got = f.read(out.values.data(), out.values.size());
  AMP_REQUIRE(got == out.values.size(), "IDX file '", path, "' is truncated: header promises ", total,
              " values, the file has ", got);
  std::uint8_t extra;
  AMP_REQUIRE(f.read(&extra, 1) == 0, "IDX file '", path, "' is longer than its header says (", total,
              " values): trailing data");
  return out;
}

// Images (N x rows x cols) with their labels (N), checked against each other.
struct LabelledImages {
  std::int64_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols
  std::vector<std::int32_t> labels;  // count
};

inline LabelledImages read_idx_pair(const std::string& images_path, const std::string& labels_path,
                                    int classes) {
  IdxArray images = read_idx(images_path, 3);
  const IdxArray labels = read_idx(labels_path, 1);
  AMP_REQUIRE(images.count() == labels.count(), "'", images_path, "' has ", images.count(), " images but '",
              labels_path, "' has ", labels.count(), " labels");
  LabelledImages out{images.dims[0], images.dims[1], images.dims[2], std::move(images.values), {}};
  out.labels.resize(labels.values.size());
  for (std::size_t i = 0; i < labels.values.size(); ++i) {
    AMP_REQUIRE(labels.values[i] < classes, "'", labels_path, "': label ", int(labels.values[i]), " at index ", i,
                " is outside [0, ", classes, ")");
    out.labels[i] = labels.values[i];
  }
  return out;
}

}  // namespace amp::data
