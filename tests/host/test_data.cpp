#include <doctest/doctest.h>

#include <cstdio>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <zlib.h>

#include "amp/amp.hpp"
#include "amp/data/idx.hpp"
#include "amp/data/loader.hpp"
#include "amp/io/atomic_file.hpp"

using namespace amp;
namespace fs = std::filesystem;

namespace {
// An IDX byte stream: header (magic, dims) then payload.
std::vector<std::uint8_t> idx_bytes(std::vector<std::uint32_t> dims, std::size_t payload, std::uint8_t type = 0x08) {
  std::vector<std::uint8_t> out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(d >> s));
  for (std::size_t i = 0; i < payload; ++i) out.push_back(static_cast<std::uint8_t>(i % 7));
  return out;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("amp-test-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::vector<std::uint8_t>& bytes, bool gzip) const {
    const std::string p = (path / name).string();
    if (gzip) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    } else {
      std::FILE* f = std::fopen(p.c_str(), "wb");
      std::fwrite(bytes.data(), 1, bytes.size(), f);
      std::fclose(f);
    }
    return p;
  }
};
}  // namespace

TEST_CASE("IDX: valid files, gzip and raw") {
  TempDir dir;
  for (const bool gz : {true, false}) {
    CAPTURE(gz);
    const auto images = dir.write("img", idx_bytes({3, 2, 4}, 24), gz);
    std::vector<std::uint8_t> labels = idx_bytes({3}, 0);
    labels.insert(labels.end(), {1, 9, 0});
    const auto lab = dir.write("lab", labels, gz);
    const auto a = data::read_idx(images, 3);
    CHECK(a.dims == std::vector<std::int64_t>{3, 2, 4});
    CHECK(a.values.size() == 24);
    CHECK(a.values[8] == 1);
    const auto set = data::read_idx_pair(images, lab, 10);
    CHECK(set.count == 3);
    CHECK(set.rows == 2);
    CHECK(set.cols == 4);
    CHECK(set.labels == std::vector<std::int32_t>{1, 9, 0});
  }
}

TEST_CASE("IDX: malformed files are refused with the file and the fault named") {
  TempDir dir;
  auto expect = [&](const std::vector<std::uint8_t>& bytes, int rank, const char* what) {
    for (const bool gz : {true, false}) {
      const auto p = dir.write(gz ? "f.gz" : "f", bytes, gz);
      CHECK_THROWS_WITH_AS(data::read_idx(p, rank), doctest::Contains(what), Error);
      CHECK_THROWS_WITH_AS(data::read_idx(p, rank), doctest::Contains(p.c_str()), Error);
    }
  };
  auto truncated = idx_bytes({3, 2, 4}, 23);
  expect(truncated, 3, "is truncated: header promises 24 values, the file has 23");
  expect(idx_bytes({3, 2, 4}, 25), 3, "longer than its header says");
  auto bad_magic = idx_bytes({3, 2, 4}, 24);
  bad_magic[0] = 0x1f;
  expect(bad_magic, 3, "bad magic number");
  expect(idx_bytes({3, 2, 4}, 24, 0x0d), 3, "element type 0xd");
  expect(idx_bytes({3, 2, 4}, 24), 1, "has 3 dimensions, expected 1");
  expect({0, 0}, 3, "no 4-byte header");
  expect({0, 0, 8, 3, 0, 0}, 3, "truncated inside its header");
  CHECK_THROWS_WITH_AS(data::read_idx((dir.path / "missing").string(), 1), doctest::Contains("cannot open IDX file"), Error);
}

TEST_CASE("IDX: images and labels must match, and labels must be classes") {
  TempDir dir;
  const auto images = dir.write("img", idx_bytes({3, 2, 2}, 12), true);
  auto labels4 = idx_bytes({4}, 0);
  labels4.insert(labels4.end(), {0, 1, 2, 3});
  CHECK_THROWS_WITH_AS(data::read_idx_pair(images, dir.write("l4", labels4, true), 10),
                       doctest::Contains("has 3 images but"), Error);
  auto labels3 = idx_bytes({3}, 0);
  labels3.insert(labels3.end(), {0, 12, 2});
  CHECK_THROWS_WITH_AS(data::read_idx_pair(images, dir.write("l3", labels3, true), 10),
                       doctest::Contains("label 12 at index 1 is outside [0, 10)"), Error);
}

TEST_CASE("loader: seeded shuffle, normalisation and the last partial batch") {
  Context<host> ctx;
  data::LabelledImages set{10, 1, 2, {}, {}};
  for (int i = 0; i < 10; ++i) {
    set.pixels.push_back(static_cast<std::uint8_t>(i));
    set.pixels.push_back(255);
    set.labels.push_back(i % 10);
  }
  data::Loader<float, host> a(ctx, set, {.batch_size = 4, .seed = 3, .mean = 0.5f, .stddev = 0.5f});
  data::Loader<float, host> b(ctx, set, {.batch_size = 4, .seed = 3, .mean = 0.5f, .stddev = 0.5f});
  CHECK(a.batches() == 3);
  a.start_epoch();
  b.start_epoch();
  std::vector<int> seen;
  for (std::int64_t k = 0; k < a.batches(); ++k) {
    const auto ba = a.batch(k);
    const auto ra = std::vector<float>(ba.x.data, ba.x.data + ba.x.size());
    const auto la = std::vector<std::int32_t>(ba.labels.data, ba.labels.data + ba.labels.size);
    const auto bb = b.batch(k);
    CHECK(ra == std::vector<float>(bb.x.data, bb.x.data + bb.x.size()));
    CHECK(ba.x.rows == (k == 2 ? 2 : 4));
    for (std::int64_t r = 0; r < ba.x.rows; ++r) {
      CHECK(ra[r * 2 + 1] == doctest::Approx(1.0));  // (255/255 - 0.5) / 0.5
      CHECK(ra[r * 2] == doctest::Approx((la[r] / 255.0 - 0.5) / 0.5));
      seen.push_back(la[r]);
    }
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("atomic file writes leave either the old or the new file") {
  const std::string p = (fs::temp_directory_path() / "amp-atomic.txt").string();
  io::write_file_atomically(p, "first");
  io::write_file_atomically(p, "second");
  std::FILE* f = std::fopen(p.c_str(), "rb");
  char buf[16] = {};
  CHECK(std::fread(buf, 1, sizeof buf, f) == 6);
  std::fclose(f);
  CHECK(std::string(buf) == "second");
  CHECK(!fs::exists(p + ".tmp"));
  fs::remove(p);
  CHECK_THROWS_WITH_AS(io::write_file_atomically("/nonexistent-dir/x.json", "y"), doctest::Contains("cannot write '/nonexistent-dir/x.json'"), Error);
}
