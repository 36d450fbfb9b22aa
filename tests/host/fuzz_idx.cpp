// Fuzzing the IDX reader with a fixed seed: thousands of byte flips,
// truncations and extensions of small valid raw and gzip files. Every case must
// read back exactly the original content or throw amp::Error, and no case may
// allocate more than a bound (operator new is counted here) or crash (the
// sanitizer build runs this too). Raw IDX has no checksum, so raw files get
// header flips, truncations and extensions; gzip files get flips anywhere.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "amp/data/idx.hpp"

namespace {
std::size_t current_bytes = 0, peak_bytes = 0;
}  // namespace

// Every allocation carries its size in front, so frees can be counted.
void* operator new(std::size_t n) {
  auto* p = static_cast<std::size_t*>(std::malloc(n + 16));
  if (!p) throw std::bad_alloc();
  *p = n;
  current_bytes += n;
  if (current_bytes > peak_bytes) peak_bytes = current_bytes;
  return reinterpret_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  auto* base = reinterpret_cast<std::size_t*>(static_cast<char*>(p) - 16);
  current_bytes -= *base;
  std::free(base);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {
namespace fs = std::filesystem;

std::vector<std::uint8_t> gzip_of(const std::vector<std::uint8_t>& raw) {
  uLongf size = compressBound(static_cast<uLong>(raw.size())) + 32;
  std::vector<std::uint8_t> out(size);
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  z.next_in = const_cast<Bytef*>(raw.data());
  z.avail_in = static_cast<uInt>(raw.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void write(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

struct Outcome {
  int same = 0, refused = 0;
};

// Mutates `base` `cases` times; checks each read. flip_limit: flips only in the
// first flip_limit bytes (the header of a raw file), or anywhere when 0.
void fuzz(const std::vector<std::uint8_t>& base, const std::vector<std::uint8_t>& payload, int rank, int cases,
          std::size_t flip_limit, std::uint32_t seed, Outcome& outcome) {
  const std::string path = (fs::temp_directory_path() / ("amp-fuzz-" + std::to_string(::getpid()))).string();
  std::mt19937 gen(seed);
  for (int c = 0; c < cases; ++c) {
    std::vector<std::uint8_t> bytes = base;
    const int kind = static_cast<int>(gen() % 4);
    if (kind == 0 || kind == 3) {  // 1-3 bit flips
      const std::size_t span = flip_limit ? flip_limit : bytes.size();
      for (int f = 0, n = 1 + static_cast<int>(gen() % 3); f < n; ++f) bytes[gen() % span] ^= static_cast<std::uint8_t>(1u << (gen() % 8));
    }
    if (kind == 1 || kind == 3) bytes.resize(gen() % bytes.size());  // truncation
    if (kind == 2) {                                                 // extension
      for (int e = 0, n = 1 + static_cast<int>(gen() % 16); e < n; ++e) bytes.push_back(static_cast<std::uint8_t>(gen()));
    }
    write(path, bytes);
    CAPTURE(c);
    CAPTURE(kind);
    const std::size_t before = current_bytes;
    peak_bytes = current_bytes;
    try {
      const auto got = amp::data::read_idx(path, rank);
      REQUIRE(got.values == payload);  // accepted: exactly the original
      ++outcome.same;
    } catch (const amp::Error&) {
      ++outcome.refused;
    }
    REQUIRE(peak_bytes - before <= (std::size_t{4} << 20));  // the reader's chunks, never the header's claim
  }
  std::remove(path.c_str());
}
}  // namespace

TEST_CASE("fuzz: damaged IDX files read back exactly or are refused, within bounded memory") {
  std::vector<std::uint8_t> header{0, 0, 8, 3, 0, 0, 0, 7, 0, 0, 0, 5, 0, 0, 0, 4};
  std::vector<std::uint8_t> payload(7 * 5 * 4);
  std::mt19937 gen(1);
  for (auto& v : payload) v = static_cast<std::uint8_t>(gen() % 7);  // compressible, like images
  std::vector<std::uint8_t> raw = header;
  raw.insert(raw.end(), payload.begin(), payload.end());

  Outcome gz, plain;
  fuzz(gzip_of(raw), payload, 3, 3000, 0, 11, gz);
  fuzz(raw, payload, 3, 1500, header.size(), 12, plain);
  MESSAGE("gzip: ", gz.same, " read back exactly, ", gz.refused, " refused; raw: ", plain.same, " exactly, ",
          plain.refused, " refused");
  CHECK(gz.refused > 2000);  // most damage is caught
  CHECK(plain.refused > 1000);
}
