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
#include "amp/io/file.hpp"

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
  expect(idx_bytes({268435455, 4, 4}, 16), 3, "is truncated: header promises 4294967280 values, the file has 16");
  expect(idx_bytes({65536, 65536, 2}, 16), 3, "declares 8589934592 values, over the limit of 4294967296");
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
    CHECK(ba.x.shape == Shape{k == 2 ? 2 : 4, 2});
    for (std::int64_t r = 0; r < ba.x.shape[0]; ++r) {
      CHECK(ra[r * 2 + 1] == doctest::Approx(1.0));  // (255/255 - 0.5) / 0.5
      CHECK(ra[r * 2] == doctest::Approx((la[r] / 255.0 - 0.5) / 0.5));
      seen.push_back(la[r]);
    }
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // Images come channels-last; the statistics are of pixel / 255.
  data::Loader<float, host> images(ctx, set, {.batch_size = 4, .layout = data::Layout::image});
  CHECK(images.batch(0).x.shape == Shape{4, 1, 2, 1});
  const auto [mean, stddev] = data::pixel_statistics(set);
  CHECK(mean == doctest::Approx((4.5 + 255) / 2 / 255.0));
  CHECK(stddev > 0.0f);
}

TEST_CASE("IDX gzip: the trailer is verified and nothing may follow it") {
  TempDir dir;
  auto labels = idx_bytes({300}, 300);
  const std::string good = dir.write("l.gz", labels, true);
  std::vector<std::uint8_t> gz;
  {
    std::FILE* f = std::fopen(good.c_str(), "rb");
    for (int c; (c = std::fgetc(f)) != EOF;) gz.push_back(static_cast<std::uint8_t>(c));
    std::fclose(f);
  }
  CHECK(data::read_idx(good, 1).values == std::vector<std::uint8_t>(labels.begin() + 8, labels.end()));
  auto write_raw = [&](const std::string& name, const std::vector<std::uint8_t>& bytes) { return dir.write(name, bytes, false); };

  // The trailer cut off (8 bytes: CRC-32 and length): refused, not read as end of file.
  const std::vector<std::uint8_t> cut(gz.begin(), gz.end() - 8);
  CHECK_THROWS_WITH_AS(data::read_idx(write_raw("cut.gz", cut), 1),
                       doctest::Contains("is truncated: its gzip stream ends before its trailer"), Error);
  // A bit flipped near the end of the data, with the trailer cut (the reported case): refused.
  auto flipped = cut;
  flipped[flipped.size() - 3] ^= 0x10;
  CHECK_THROWS_AS(data::read_idx(write_raw("flip-cut.gz", flipped), 1), Error);
  // A bit flipped with the trailer kept: the CRC-32 says so.
  auto flipped_whole = gz;
  flipped_whole[gz.size() - 12] ^= 0x10;
  CHECK_THROWS_WITH_AS(data::read_idx(write_raw("flip.gz", flipped_whole), 1), doctest::Contains("is damaged: gzip"), Error);
  // Bytes after the stream.
  auto extended = gz;
  extended.insert(extended.end(), {1, 2, 3});
  CHECK_THROWS_WITH_AS(data::read_idx(write_raw("ext.gz", extended), 1),
                       doctest::Contains("has 3 bytes after the end of its gzip stream"), Error);
  // A header that claims 4 GB inside a small gzip file fails after reading what is there.
  CHECK_THROWS_WITH_AS(data::read_idx(dir.write("big.gz", idx_bytes({268435455, 4, 4}, 16), true), 3),
                       doctest::Contains("header promises 4294967280 values, the file has 16"), Error);
  CHECK_THROWS_WITH_AS(data::read_idx(dir.path.string(), 1), doctest::Contains("is not a regular file"), Error);
}

namespace {
std::string read_text(const std::string& path) {
  std::string out;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  for (int c; f && (c = std::fgetc(f)) != EOF;) out.push_back(static_cast<char>(c));
  if (f) std::fclose(f);
  return out;
}
}  // namespace

TEST_CASE("write_file: regular files atomically, links followed, special files written in place") {
  TempDir dir;
  const std::string p = (dir.path / "out.json").string();
  io::write_file(p, "first");
  io::write_file(p, "second");
  CHECK(read_text(p) == "second");
  for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().filename() == "out.json");  // no temporaries left

  // Through a symbolic link: the target changes, the link stays a link.
  const std::string link = (dir.path / "link.json").string();
  fs::create_symlink(p, link);
  io::write_file(link, "third");
  CHECK(fs::is_symlink(link));
  CHECK(read_text(p) == "third");

  // Devices are written, not replaced; their errors are reported.
  CHECK_NOTHROW(io::write_file("/dev/null", "x"));
  CHECK(fs::is_character_file("/dev/null"));
  if (fs::exists("/dev/full")) {
    CHECK_THROWS_WITH_AS(io::write_file("/dev/full", "x"), doctest::Contains("cannot write '/dev/full': No space left"),
                         Error);
    CHECK(fs::is_character_file("/dev/full"));
  }
  CHECK_THROWS_WITH_AS(io::write_file("/nonexistent-dir/x.json", "y"),
                       doctest::Contains("cannot write '/nonexistent-dir/x.json'"), Error);
}

TEST_CASE("check_writable refuses a bad output before anything is written") {
  TempDir dir;
  CHECK_NOTHROW(io::check_writable((dir.path / "new.csv").string(), "--csv"));
  CHECK_NOTHROW(io::check_writable("/dev/null", "--json"));
  CHECK_THROWS_WITH_AS(io::check_writable((dir.path / "no-such-folder" / "x.csv").string(), "--csv"),
                       doctest::Contains("--csv '"), Error);
  CHECK_THROWS_WITH_AS(io::check_writable((dir.path / "no-such-folder" / "x.csv").string(), "--csv"),
                       doctest::Contains("' does not exist"), Error);
  CHECK_THROWS_WITH_AS(io::check_writable(dir.path.string(), "--json"), doctest::Contains("is a folder, not a file"),
                       Error);
  CHECK_THROWS_WITH_AS(io::check_writable("", "--json"), doctest::Contains("--json: empty file name"), Error);
}

TEST_CASE("FileSet writes all files or none") {
  TempDir dir;
  const std::string a = (dir.path / "a.json").string(), b = (dir.path / "sub" / "b.csv").string();
  io::write_file(a, "old");
  {
    io::FileSet set;
    set.add(a, "new");
    CHECK_THROWS_AS(set.add(b, "new"), Error);  // its folder does not exist
  }  // not committed: the staged a.json is discarded
  CHECK(read_text(a) == "old");
  for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().filename() == "a.json");
  io::FileSet set;
  set.add(a, "newer");
  set.commit();
  CHECK(read_text(a) == "newer");
}
