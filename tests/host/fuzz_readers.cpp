// Fuzzing amp's readers (IDX data, checkpoints, safetensors, token files) with a fixed
// seed: thousands of bit flips, truncations and extensions of small valid
// files. Every case must read back exactly the original content or throw
// amp::Error, and no case may allocate more than a bound (operator new is
// counted here: a size field is never trusted before it is checked) or crash
// (the sanitizer build runs this too). Formats without a checksum (raw IDX,
// safetensors, token files) get their flips in the header only.
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

#include "amp/amp.hpp"
#include "amp/data/idx.hpp"
#include "amp/data/tokens.hpp"
#include "amp/io/checkpoint.hpp"
#include "amp/io/safetensors.hpp"

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

std::vector<std::uint8_t> bytes_of(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  std::vector<std::uint8_t> out;
  for (int c; (c = std::fgetc(f)) != EOF;) out.push_back(static_cast<std::uint8_t>(c));
  std::fclose(f);
  return out;
}

// Mutates `base` `cases` times and reads each with read(path), which returns
// whether the content read back is the original (or throws amp::Error).
// flip_limit: flips only in the first flip_limit bytes (a header), or anywhere when 0.
template <class Read>
Outcome fuzz(const std::vector<std::uint8_t>& base, int cases, std::size_t flip_limit, std::uint32_t seed,
             std::size_t max_bytes, Read read) {
  const std::string path = (fs::temp_directory_path() / ("amp-fuzz-" + std::to_string(::getpid()))).string();
  std::mt19937 gen(seed);
  Outcome outcome;
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
      const bool same = read(path);
      REQUIRE(same);  // accepted: exactly the original
      ++outcome.same;
    } catch (const amp::Error&) {
      ++outcome.refused;
    }
    REQUIRE(peak_bytes - before <= max_bytes);  // bounded by the file, never by a header's claim
  }
  std::remove(path.c_str());
  return outcome;
}
}  // namespace

TEST_CASE("fuzz: damaged IDX files read back exactly or are refused, within bounded memory") {
  std::vector<std::uint8_t> header{0, 0, 8, 3, 0, 0, 0, 7, 0, 0, 0, 5, 0, 0, 0, 4};
  std::vector<std::uint8_t> payload(7 * 5 * 4);
  std::mt19937 gen(1);
  for (auto& v : payload) v = static_cast<std::uint8_t>(gen() % 7);  // compressible, like images
  std::vector<std::uint8_t> raw = header;
  raw.insert(raw.end(), payload.begin(), payload.end());

  const auto read = [&](const std::string& path) { return amp::data::read_idx(path, 3).values == payload; };
  const std::size_t bound = std::size_t{4} << 20;  // the reader's chunks
  const Outcome gz = fuzz(gzip_of(raw), 3000, 0, 11, bound, read);
  const Outcome plain = fuzz(raw, 1500, header.size(), 12, bound, read);
  MESSAGE("gzip: ", gz.same, " read back exactly, ", gz.refused, " refused; raw: ", plain.same, " exactly, ",
          plain.refused, " refused");
  CHECK(gz.refused > 2000);  // most damage is caught
  CHECK(plain.refused > 1000);
}

namespace {
using Net = amp::nn::Sequential<amp::O2Policy, amp::host, amp::nn::Linear, amp::nn::BatchNorm1d, amp::nn::ReLU,
                                amp::nn::Linear>;
Net make_net(amp::Context<amp::host>& ctx, std::uint64_t seed) {
  return Net(ctx, {.max_batch = 4, .seed = seed}, {.in_features = 5, .out_features = 8}, {.features = 8}, {},
             {.in_features = 8, .out_features = 2});
}
std::vector<std::vector<float>> all_values(Net& net) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < static_cast<int>(net.parameters().table().size()); ++i) out.push_back(net.parameters().get_values(i));
  return out;
}
void set_all(Net& net, const std::vector<std::vector<float>>& v) {
  for (int i = 0; i < static_cast<int>(v.size()); ++i) net.parameters().set_values(i, v[static_cast<std::size_t>(i)]);
}
}  // namespace

TEST_CASE("fuzz: damaged checkpoints load exactly or are refused and change nothing, within bounded memory") {
  amp::Context<amp::host> ctx;
  auto net = make_net(ctx, 1);
  amp::optim::Adam<amp::O2Policy, amp::host> opt(net.parameters(), {.lr = 0.1f});
  const std::string good = (fs::temp_directory_path() / ("amp-fuzz-good-" + std::to_string(::getpid()))).string();
  amp::io::save(good, net, opt);
  const auto base = bytes_of(good);
  std::remove(good.c_str());

  auto target = make_net(ctx, 2);
  amp::optim::Adam<amp::O2Policy, amp::host> target_opt(target.parameters(), {.lr = 0.1f});
  const auto untouched = all_values(target), original = all_values(net);
  const Outcome o = fuzz(base, 3000, 0, 13, 4 * base.size() + (64 << 10), [&](const std::string& path) {
    try {
      amp::io::load(path, target, target_opt);
    } catch (const amp::Error&) {
      REQUIRE(all_values(target) == untouched);
      throw;
    }
    const bool same = all_values(target) == original;
    set_all(target, untouched);
    return same;
  });
  MESSAGE("checkpoint (", base.size(), " bytes): ", o.same, " loaded exactly, ", o.refused, " refused");
  CHECK(o.refused == 3000);  // every byte is under a CRC or checked
}

TEST_CASE("fuzz: damaged safetensors headers import exactly or are refused and change nothing") {
  amp::Context<amp::host> ctx;
  auto net = make_net(ctx, 1);
  const std::string good = (fs::temp_directory_path() / ("amp-fuzz-good-" + std::to_string(::getpid()))).string();
  amp::io::export_safetensors(good, net.parameters());
  const auto base = bytes_of(good);
  std::remove(good.c_str());
  std::uint64_t header = 0;
  std::memcpy(&header, base.data(), 8);

  auto target = make_net(ctx, 2);
  const auto untouched = all_values(target), original = all_values(net);
  const Outcome o = fuzz(base, 3000, 8 + header, 14, 8 * base.size() + (64 << 10), [&](const std::string& path) {
    try {
      amp::io::import_safetensors(path, target.parameters());
    } catch (const amp::Error&) {
      REQUIRE(all_values(target) == untouched);
      throw;
    }
    const bool same = all_values(target) == original;
    set_all(target, untouched);
    return same;
  });
  MESSAGE("safetensors (", base.size(), " bytes, header ", header, "): ", o.same, " imported exactly, ", o.refused,
          " refused");
  CHECK(o.refused > 2000);
}

TEST_CASE("fuzz: damaged llm.c token files read exactly or are refused") {
  const std::string good = (fs::temp_directory_path() / ("amp-fuzz-tokens-" + std::to_string(::getpid()))).string();
  std::vector<std::int32_t> ids(3000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7919) % 50257);
  amp::data::write_tokens(good, ids);
  const auto base = bytes_of(good);
  std::remove(good.c_str());
  // Flips in the header's three fields (magic, version, count); the ids have no checksum.
  const Outcome o = fuzz(base, 3000, 12, 15, 4 * base.size() + (64 << 10),
                         [&](const std::string& path) { return amp::data::read_tokens(path, 50257) == ids; });
  MESSAGE("token file (", base.size(), " bytes): ", o.same, " read exactly, ", o.refused, " refused");
  CHECK(o.refused > 2000);
}
