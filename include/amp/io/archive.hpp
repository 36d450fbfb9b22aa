#pragma once
// amp's archive format, the body of a checkpoint. Little-endian throughout:
//
//   file    = magic "AMPCKPT\n" (8 bytes), version u32 (1), records u32, record*
//   record  = name_length u32, name (UTF-8), dtype u8, rank u8, reserved u16 (0),
//             dims u64[rank], payload_bytes u64, payload, crc32 u32
//   dtype   = 1 fp32, 2 fp16, 3 bf16, 4 int64, 5 bytes (text), 6 fp64
//
// The CRC-32 (zlib's) covers the record from name_length to the end of the
// payload. A reader checks every field against the bytes the file actually
// has before it allocates anything, every CRC, and that nothing follows the
// last record; any fault is an amp::Error naming the file and the fault.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <zlib.h>

#include "amp/core/error.hpp"

namespace amp::io {

enum class dtype : std::uint8_t { fp32 = 1, fp16 = 2, bf16 = 3, int64 = 4, bytes = 5, fp64 = 6 };

inline std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::fp32: return 4;
    case dtype::fp16: case dtype::bf16: return 2;
    case dtype::int64: case dtype::fp64: return 8;
    case dtype::bytes: return 1;
  }
  return 0;
}
inline const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::fp32: return "fp32";
    case dtype::fp16: return "fp16";
    case dtype::bf16: return "bf16";
    case dtype::int64: return "int64";
    case dtype::bytes: return "bytes";
    case dtype::fp64: return "fp64";
  }
  return "?";
}

struct Record {
  dtype type = dtype::bytes;
  std::vector<std::uint64_t> shape;
  std::string payload;  // raw little-endian bytes

  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::string text() const { return payload; }
  template <class T>
  std::vector<T> values() const {
    std::vector<T> out(payload.size() / sizeof(T));
    std::memcpy(out.data(), payload.data(), out.size() * sizeof(T));
    return out;
  }
};

// Named records, written or read as a whole.
class Archive {
 public:
  static constexpr char magic[9] = "AMPCKPT\n";
  static constexpr std::uint32_t version = 1;
  static constexpr std::uint64_t max_name = 4096, max_rank = 8, max_records = 1u << 20;

  template <class T>
  void put(const std::string& name, dtype type, std::vector<std::uint64_t> shape, const T* data, std::size_t count) {
    Record r{type, std::move(shape), std::string(reinterpret_cast<const char*>(data), count * sizeof(T))};
    records_[name] = std::move(r);
  }
  void put_text(const std::string& name, std::string_view text) {
    records_[name] = Record{dtype::bytes, {text.size()}, std::string(text)};
  }
  void put_int64(const std::string& name, const std::vector<std::int64_t>& v) {
    put(name, dtype::int64, {v.size()}, v.data(), v.size());
  }

  const Record* find(const std::string& name) const {
    const auto it = records_.find(name);
    return it == records_.end() ? nullptr : &it->second;
  }
  const std::map<std::string, Record>& records() const { return records_; }

  std::string serialize() const {
    std::string out(magic, 8);
    append(out, version);
    append(out, static_cast<std::uint32_t>(records_.size()));
    for (const auto& [name, r] : records_) {
      const std::size_t begin = out.size();
      append(out, static_cast<std::uint32_t>(name.size()));
      out += name;
      out += static_cast<char>(r.type);
      out += static_cast<char>(r.shape.size());
      append(out, std::uint16_t{0});
      for (auto d : r.shape) append(out, d);
      append(out, static_cast<std::uint64_t>(r.payload.size()));
      out += r.payload;
      append(out, static_cast<std::uint32_t>(
                      crc32_z(0, reinterpret_cast<const Bytef*>(out.data() + begin), out.size() - begin)));
    }
    return out;
  }

  // Reads and checks a whole archive file.
  static Archive read(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    AMP_REQUIRE(f, "cannot open checkpoint '", path, "'");
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return parse(bytes, path);
  }

  static Archive parse(std::string_view b, const std::string& path) {
    Cursor c{b, 0, path};
    AMP_REQUIRE(b.size() >= 8 && std::memcmp(b.data(), magic, 8) == 0, "checkpoint '", path,
                "' is not an amp checkpoint (bad magic number)");
    c.at = 8;
    const auto v = c.get<std::uint32_t>("version");
    AMP_REQUIRE(v == version, "checkpoint '", path, "' has format version ", v, "; this amp reads version ", version);
    const auto count = c.get<std::uint32_t>("record count");
    AMP_REQUIRE(count <= max_records, "checkpoint '", path, "' claims ", count, " records");
    Archive a;
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::size_t begin = c.at;
      const auto name_length = c.get<std::uint32_t>("a record's name length");
      AMP_REQUIRE(name_length > 0 && name_length <= max_name, "checkpoint '", path, "': record ", i,
                  " has a name of ", name_length, " bytes");
      const std::string name(c.take(name_length, "a record's name"));
      Record r;
      const auto type = c.get<std::uint8_t>("a dtype");
      AMP_REQUIRE(type >= 1 && type <= 6, "checkpoint '", path, "': tensor '", name, "' has an unknown dtype ", int(type));
      r.type = static_cast<dtype>(type);
      const auto rank = c.get<std::uint8_t>("a rank");
      AMP_REQUIRE(rank <= max_rank && c.get<std::uint16_t>("a reserved field") == 0, "checkpoint '", path,
                  "': tensor '", name, "' has a damaged header");
      std::uint64_t numel = 1;
      for (int d = 0; d < rank; ++d) {
        const auto dim = c.get<std::uint64_t>("a dimension");
        AMP_REQUIRE(dim <= b.size(), "checkpoint '", path, "': tensor '", name, "' claims a dimension of ", dim);
        r.shape.push_back(dim);
        numel *= dim;
        AMP_REQUIRE(numel <= b.size(), "checkpoint '", path, "': tensor '", name, "' claims more elements than the file has");
      }
      const auto payload = c.get<std::uint64_t>("a payload size");
      AMP_REQUIRE(payload == numel * dtype_size(r.type), "checkpoint '", path, "': tensor '", name, "' has ", payload,
                  " bytes for ", numel, " ", dtype_name(r.type), " values");
      r.payload = std::string(c.take(payload, "a payload"));
      const auto stored = c.get<std::uint32_t>("a CRC-32");
      const auto actual = static_cast<std::uint32_t>(
          crc32_z(0, reinterpret_cast<const Bytef*>(b.data() + begin), c.at - 4 - begin));
      AMP_REQUIRE(stored == actual, "checkpoint '", path, "': tensor '", name, "' is damaged (CRC-32 mismatch)");
      AMP_REQUIRE(a.records_.emplace(name, std::move(r)).second, "checkpoint '", path, "' has tensor '", name, "' twice");
    }
    AMP_REQUIRE(c.at == b.size(), "checkpoint '", path, "' has ", b.size() - c.at, " bytes after its last record");
    return a;
  }

 private:
  template <class T>
  static void append(std::string& out, T v) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));  // little-endian machines only (x86-64, arm64)
    out.append(bytes, sizeof(T));
  }

  struct Cursor {
    std::string_view b;
    std::size_t at;
    const std::string& path;
    std::string_view take(std::uint64_t n, const char* what) {
      AMP_REQUIRE(n <= b.size() - at, "checkpoint '", path, "' is truncated (", what, " runs past the end at byte ", at,
                  ")");
      const std::string_view out = b.substr(at, n);
      at += n;
      return out;
    }
    template <class T>
    T get(const char* what) {
      T v;
      std::memcpy(&v, take(sizeof(T), what).data(), sizeof(T));
      return v;
    }
  };

  std::map<std::string, Record> records_;
};

namespace detail {
inline std::string meta_value(const std::string& meta, const std::string& key) {
  std::istringstream in(meta);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  return {};
}
}  // namespace detail

// A checkpoint's record of how it was saved ("amp.meta": policy, optimizer,
// scaling, ...), by key; "" where the archive has no such record or key.
inline std::string checkpoint_meta(const Archive& a, const std::string& key) {
  const Record* meta = a.find("amp.meta");
  return meta ? detail::meta_value(meta->text(), key) : std::string();
}

}  // namespace amp::io
