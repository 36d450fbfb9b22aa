#pragma once
// IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed. A file
// is read exactly or refused with an amp::Error naming it and the fault:
// - every header field is checked; the payload must have exactly the length
//   the header declares, and a declared size over max_idx_values is refused;
// - a raw file's length is checked against its header before anything is
//   allocated; a gzip file is inflated in bounded chunks, so memory follows the
//   data actually present, never the header's claim;
// - a gzip stream must end with its trailer, whose CRC-32 and length zlib
//   verifies, and nothing may follow it.
// Raw IDX has no checksum: a changed payload byte in a raw file reads as data.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <zlib.h>

#include "amp/core/error.hpp"

namespace amp::data {

// The largest payload read_idx accepts: 2^32 values (4 GiB).
inline constexpr std::uint64_t max_idx_values = std::uint64_t{1} << 32;

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;
  std::int64_t count() const { return dims.empty() ? 0 : dims[0]; }
};

namespace detail {
// A file's bytes in order: as stored, or inflated when it starts with gzip's magic.
class IdxSource {
 public:
  explicit IdxSource(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {
    AMP_REQUIRE(f_, "cannot open IDX file '", path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(::fileno(f_), &st) != 0 || !S_ISREG(st.st_mode)) {
      std::fclose(f_);
      fail("IDX file '", path, "' is not a regular file");
    }
    std::fseek(f_, 0, SEEK_END);
    size_ = static_cast<std::uint64_t>(std::ftell(f_));
    std::fseek(f_, 0, SEEK_SET);
    unsigned char magic[2] = {};
    gzip_ = std::fread(magic, 1, 2, f_) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    std::fseek(f_, 0, SEEK_SET);
    if (gzip_) {
      AMP_REQUIRE(inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK, "IDX file '", path, "': zlib cannot start");  // gzip only
      z_ready_ = true;
    }
  }
  IdxSource(const IdxSource&) = delete;
  IdxSource& operator=(const IdxSource&) = delete;
  ~IdxSource() {
    if (z_ready_) inflateEnd(&z_);
    std::fclose(f_);
  }

  bool gzip() const { return gzip_; }
  // Bytes left in a raw file (gzip: unknown until inflated).
  std::uint64_t raw_bytes_left() const { return size_ - consumed_; }

  // Up to n bytes; fewer only where the data ends.
  std::size_t read(void* dst, std::size_t n) {
    if (!gzip_) {
      const std::size_t got = std::fread(dst, 1, n, f_);
      AMP_REQUIRE(!std::ferror(f_), "IDX file '", path_, "': read error");
      consumed_ += got;
      return got;
    }
    AMP_REQUIRE(n < (std::size_t{1} << 30), "IdxSource::read: chunk too large");
    z_.next_out = static_cast<Bytef*>(dst);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out > 0 && !ended_) {
      if (z_.avail_in == 0) {
        refill();
        AMP_REQUIRE(z_.avail_in > 0, "IDX file '", path_, "' is truncated: its gzip stream ends before its trailer");
      }
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) ended_ = true;  // the trailer's CRC-32 and length matched
      else AMP_REQUIRE(rc == Z_OK || rc == Z_BUF_ERROR, "IDX file '", path_, "' is damaged: gzip: ",
                       z_.msg ? z_.msg : zError(rc));
    }
    return n - z_.avail_out;
  }

  // After the payload: nothing may follow (raw: no byte; gzip: the stream has
  // ended, trailer verified, and no byte follows the trailer).
  void expect_end(std::uint64_t declared) {
    unsigned char extra = 0;
    AMP_REQUIRE(read(&extra, 1) == 0, "IDX file '", path_, "' is longer than its header says (", declared,
                " values): trailing data");
    if (!gzip_) return;
    AMP_REQUIRE(ended_, "IDX file '", path_, "' is truncated: its gzip stream ends before its trailer");
    const std::uint64_t after = z_.avail_in + (size_ - consumed_);
    AMP_REQUIRE(after == 0, "IDX file '", path_, "' has ", after, " bytes after the end of its gzip stream");
  }

 private:
  void refill() {
    const std::size_t got = std::fread(in_, 1, sizeof in_, f_);
    AMP_REQUIRE(!std::ferror(f_), "IDX file '", path_, "': read error");
    consumed_ += got;
    z_.next_in = in_;
    z_.avail_in = static_cast<uInt>(got);
  }

  std::string path_;
  std::FILE* f_;
  std::uint64_t size_ = 0, consumed_ = 0;
  bool gzip_ = false, z_ready_ = false, ended_ = false;
  z_stream z_{};
  Bytef in_[1 << 16];
};
}  // namespace detail

// Reads an IDX file of unsigned bytes (type 0x08) with `expected_rank` dimensions.
inline IdxArray read_idx(const std::string& path, int expected_rank) {
  detail::IdxSource f(path);
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
  AMP_REQUIRE(total <= max_idx_values, "IDX file '", path, "' declares ", total, " values, over the limit of ",
              max_idx_values, " (amp::data::max_idx_values)");
  if (!f.gzip()) {  // the file's length says everything before a byte is allocated
    AMP_REQUIRE(f.raw_bytes_left() >= total, "IDX file '", path, "' is truncated: header promises ", total,
                " values, the file has ", f.raw_bytes_left());
    out.values.resize(static_cast<std::size_t>(total));
    AMP_REQUIRE(f.read(out.values.data(), out.values.size()) == out.values.size(), "IDX file '", path,
                "' is truncated: read error");
  } else {  // inflate in bounded chunks: memory follows the data present
    constexpr std::uint64_t chunk = 1 << 20;
    std::uint64_t got = 0;
    while (got < total) {
      const std::uint64_t want = std::min(chunk, total - got);
      out.values.resize(static_cast<std::size_t>(got + want));
      const std::size_t n = f.read(out.values.data() + got, static_cast<std::size_t>(want));
      got += n;
      AMP_REQUIRE(n == want, "IDX file '", path, "' is truncated: header promises ", total, " values, the file has ",
                  got);
    }
  }
  f.expect_end(total);
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

// Mean and standard deviation of the pixels (scaled to [0, 1]): what inputs are normalised by.
inline std::pair<float, float> pixel_statistics(const LabelledImages& set) {
  double sum = 0, sq = 0;
  for (const std::uint8_t p : set.pixels) sum += p, sq += static_cast<double>(p) * p;
  const double n = static_cast<double>(std::max<std::size_t>(set.pixels.size(), 1));
  const double mean = sum / n / 255.0, var = sq / n / (255.0 * 255.0) - mean * mean;
  return {static_cast<float>(mean), static_cast<float>(std::sqrt(std::max(var, 1e-12)))};
}

}  // namespace amp::data
