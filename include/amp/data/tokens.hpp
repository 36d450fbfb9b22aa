#pragma once
// Pre-tokenised text in llm.c's token-file format (what its data scripts
// write, e.g. tinyshakespeare_val.bin): a header of 256 little-endian int32,
//   [0] magic 20240520, [1] version 1 (uint16 ids), [2] the number of ids,
// the rest zero, then the ids as little-endian uint16. amp reads version 1.
// Refused with an amp::Error naming the file and the fault: another magic
// (nanoGPT's headerless .bin among them), version 2 (llm.c's uint32 ids),
// a length other than the header's count, fewer than two ids, and an id
// outside [0, vocab_size) (its position and value named).
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "amp/core/error.hpp"
#include "amp/io/file.hpp"

namespace amp::data {

inline constexpr std::int32_t token_file_magic = 20240520;
inline constexpr std::int32_t token_file_version = 1;
inline constexpr std::size_t token_header_ints = 256;

// The ids of `path`, each checked against the vocabulary.
inline std::vector<std::int32_t> read_tokens(const std::string& path, std::int64_t vocab_size) {
  AMP_REQUIRE(vocab_size > 0 && vocab_size <= 65536, "token file '", path, "': a vocabulary of ", vocab_size,
              " does not fit uint16 ids (1 .. 65536)");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  AMP_REQUIRE(f, "cannot open token file '", path, "': ", std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  struct stat st{};
  AMP_REQUIRE(fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode), "token file '", path, "' is not a regular file");
  const auto bytes = static_cast<std::uint64_t>(st.st_size);
  std::int32_t header[token_header_ints] = {};
  AMP_REQUIRE(bytes >= sizeof header && std::fread(header, sizeof header, 1, f) == 1, "token file '", path, "' has ",
              bytes, " bytes, less than its 1024-byte header");
  AMP_REQUIRE(header[0] == token_file_magic, "token file '", path, "' starts with ", header[0], ", not llm.c's magic ",
              token_file_magic, " (a headerless nanoGPT .bin needs the header: scripts/make_token_files.py writes it)");
  AMP_REQUIRE(header[1] == token_file_version, "token file '", path, "' has version ", header[1],
              "; amp reads version 1 (uint16 ids)", header[1] == 2 ? ", not 2 (uint32 ids)" : "");
  const auto count = static_cast<std::uint64_t>(static_cast<std::uint32_t>(header[2]));
  AMP_REQUIRE(header[2] >= 2 && bytes - sizeof header == 2 * count, "token file '", path, "': the header counts ",
              header[2], " ids, the file holds ", (bytes - sizeof header) / 2.0, " (need at least 2)");
  std::vector<std::uint16_t> raw(count);
  AMP_REQUIRE(std::fread(raw.data(), 2, count, f) == count, "token file '", path, "': cannot read its ", count, " ids");
  std::vector<std::int32_t> ids(count);
  for (std::size_t i = 0; i < count; ++i) {
    AMP_REQUIRE(raw[i] < vocab_size, "token file '", path, "': id ", raw[i], " at position ", i,
                " is outside the vocabulary [0, ", vocab_size, ") (--vocab-size)");
    ids[i] = raw[i];
  }
  return ids;
}

// Writes ids (each in [0, 65536)) as a version-1 token file, atomically.
inline void write_tokens(const std::string& path, const std::vector<std::int32_t>& ids) {
  AMP_REQUIRE(ids.size() >= 2 && ids.size() <= 0x7fffffffu, "write_tokens: need 2 .. 2^31 - 1 ids, got ", ids.size());
  std::int32_t header[token_header_ints] = {token_file_magic, token_file_version, static_cast<std::int32_t>(ids.size())};
  std::string out(reinterpret_cast<const char*>(header), sizeof header);
  out.reserve(out.size() + 2 * ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    AMP_REQUIRE(ids[i] >= 0 && ids[i] < 65536, "write_tokens: id ", ids[i], " at position ", i, " is not a uint16");
    const auto v = static_cast<std::uint16_t>(ids[i]);
    out.append(reinterpret_cast<const char*>(&v), 2);
  }
  io::write_file(path, out);
}

}  // namespace amp::data
