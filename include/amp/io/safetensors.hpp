#pragma once
// Weights to and from safetensors, the format PyTorch and Hugging Face users
// share: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the bytes. amp names and lays out
// its parameters as the equivalent torch.nn.Sequential does ("0.weight" of
// shape [out, in], conv weights [K, C, kh, kw], BatchNorm's running statistics
// and num_batches_tracked), so
//     model.load_state_dict(safetensors.torch.load_file("weights.safetensors"))
// just works, and a PyTorch state dict saved with safetensors.torch.save_file
// imports into amp. Export writes fp32 (the masters where the policy keeps
// them), fp16 or bf16; import takes any of them and rounds once into the policy.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/io/archive.hpp"
#include "amp/io/file.hpp"
#include "amp/model/parameters.hpp"

namespace amp::io {

namespace detail {
// The subset of JSON a safetensors header uses: objects, arrays, strings,
// integers (and the odd true/false/null in __metadata__).
struct Json {
  enum class kind { object, array, string, number, other } k = kind::other;
  std::map<std::string, Json> object;
  std::vector<Json> array;
  std::string text;
  std::int64_t number = 0;
};

class JsonReader {
 public:
  JsonReader(std::string_view s, const std::string& path) : s_(s), path_(path) {}
  Json document() {
    Json v = value(0);
    space();
    AMP_REQUIRE(at_ == s_.size(), bad("text after the header's JSON"));
    return v;
  }

 private:
  std::string bad(const char* what) const { return amp::detail::concat("safetensors file '", path_, "': ", what); }
  void space() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_]))) ++at_;
  }
  char peek() {
    space();
    AMP_REQUIRE(at_ < s_.size(), bad("the header's JSON ends early"));
    return s_[at_];
  }
  void expect(char c) {
    AMP_REQUIRE(peek() == c, bad("malformed JSON header"));
    ++at_;
  }
  Json value(int depth) {
    AMP_REQUIRE(depth < 16, bad("the header's JSON nests too deep"));
    Json v;
    const char c = peek();
    if (c == '{') {
      v.k = Json::kind::object;
      ++at_;
      if (peek() == '}') return ++at_, v;
      for (;;) {
        std::string key = string();
        expect(':');
        v.object[key] = value(depth + 1);
        if (peek() == ',') ++at_;
        else break;
      }
      expect('}');
    } else if (c == '[') {
      v.k = Json::kind::array;
      ++at_;
      if (peek() == ']') return ++at_, v;
      for (;;) {
        AMP_REQUIRE(v.array.size() < 64, bad("an array in the header is too long"));
        v.array.push_back(value(depth + 1));
        if (peek() == ',') ++at_;
        else break;
      }
      expect(']');
    } else if (c == '"') {
      v.k = Json::kind::string;
      v.text = string();
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      v.k = Json::kind::number;
      const bool negative = c == '-';
      if (negative) ++at_;
      AMP_REQUIRE(at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_])), bad("malformed number"));
      while (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))) {
        AMP_REQUIRE(v.number <= (std::int64_t{1} << 52), bad("a number in the header is too large"));
        v.number = v.number * 10 + (s_[at_++] - '0');
      }
      if (negative) v.number = -v.number;
    } else {
      for (const std::string_view word : {"true", "false", "null"})
        if (s_.substr(at_, word.size()) == word) return at_ += word.size(), v;
      AMP_REQUIRE(false, bad("malformed JSON header"));
    }
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (at_ < s_.size() && s_[at_] != '"') {
      if (s_[at_] == '\\') {
        AMP_REQUIRE(++at_ < s_.size(), bad("malformed string"));
        const char e = s_[at_];
        out += e == 'n' ? '\n' : e == 't' ? '\t' : e;  // names need no \u escapes
      } else {
        out += s_[at_];
      }
      ++at_;
    }
    AMP_REQUIRE(at_ < s_.size(), bad("unterminated string"));
    ++at_;
    return out;
  }

  std::string_view s_;
  std::size_t at_ = 0;
  const std::string& path_;
};

inline const char* safetensors_dtype(dtype t) {
  switch (t) {
    case dtype::fp16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::int64: return "I64";
    default: return "F32";
  }
}

inline bool is_counter(const nn::ParamInfo& p) {  // PyTorch keeps this one as int64
  return p.kind == nn::role::buffer && p.name.size() >= 19 &&
         p.name.compare(p.name.size() - 19, 19, "num_batches_tracked") == 0;
}
}  // namespace detail

// How a file lays tensors out where it differs from amp: 2-D weights stored
// transposed ([in, out], as transformers' Conv1D), and names that repeat a
// parameter (a tied head: {"lm_head.weight", "transformer.wte.weight"}),
// written as copies and, when a file has them, checked equal on import.
struct TensorLayout {
  std::vector<std::string> transposed;
  std::vector<std::pair<std::string, std::string>> aliases;  // file name, the parameter it repeats

  bool is_transposed(const std::string& name) const {
    return std::find(transposed.begin(), transposed.end(), name) != transposed.end();
  }
};

// The layout a net declares for transformers' files (nn::GPT2: hf_transposed(), hf_aliases()).
template <class Net>
TensorLayout hf_layout(const Net& net) {
  return {net.hf_transposed(), net.hf_aliases()};
}

namespace detail {
// A parameter's shape as the file holds it.
inline bool stored_transposed(const nn::ParamInfo& p, const TensorLayout& layout) {
  return p.shape.rank() == 2 && layout.is_transposed(p.name);
}
inline Shape file_shape(const nn::ParamInfo& p, const TensorLayout& layout) {
  return stored_transposed(p, layout) ? Shape{p.shape[1], p.shape[0]} : p.shape;
}
inline std::vector<float> transposed(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  std::vector<float> out(v.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[static_cast<std::size_t>(c * rows + r)] = v[static_cast<std::size_t>(r * cols + c)];
  return out;
}
}  // namespace detail

// Writes every parameter and buffer of `store` to `path` (atomically), as fp32, fp16 or bf16
// (the masters where the policy keeps them). ZeRO-1: every rank calls it and rank 0 writes.
template <Policy P, Backend B>
void export_safetensors(const std::string& path, const nn::ParameterStore<P, B>& store, dtype as = dtype::fp32,
                        const TensorLayout& layout = {}) {
  AMP_REQUIRE(as == dtype::fp32 || as == dtype::fp16 || as == dtype::bf16,
              "export_safetensors: tensors are written as fp32, fp16 or bf16");
  std::string header = "{\"__metadata__\": {\"format\": \"pt\", \"producer\": \"amp\"}", data;
  const auto write = [&](const std::string& name, const Shape& shape, const std::vector<float>& v, dtype t) {
    const std::size_t begin = data.size();
    for (const float x : v) {
      if (t == dtype::int64) {
        const auto i = static_cast<std::int64_t>(x);
        data.append(reinterpret_cast<const char*>(&i), 8);
      } else if (t == dtype::fp32) {
        data.append(reinterpret_cast<const char*>(&x), 4);
      } else {
        const std::uint16_t bits = t == dtype::fp16 ? amp::detail::bits(cast<half>(x)) : amp::detail::bits(cast<bfloat16>(x));
        data.append(reinterpret_cast<const char*>(&bits), 2);
      }
    }
    std::string dims;
    for (int i = 0; i < shape.rank(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    header += ", \"" + name + "\": {\"dtype\": \"" + detail::safetensors_dtype(t) + "\", \"shape\": [" + dims +
              "], \"data_offsets\": [" + std::to_string(begin) + ", " + std::to_string(data.size()) + "]}";
  };
  const auto& table = store.table();
  const bool writer = store.shard().rank == 0;  // ZeRO-1: every rank calls, the masters gather on rank 0
  for (std::size_t i = 0; i < table.size(); ++i) {
    const nn::ParamInfo& p = table[i];
    std::vector<float> v = store.values_on_root(static_cast<int>(i));
    if (!writer) continue;
    const Shape shape = detail::file_shape(p, layout);
    if (detail::stored_transposed(p, layout)) v = detail::transposed(v, p.shape[0], p.shape[1]);
    const dtype t = detail::is_counter(p) ? dtype::int64 : p.kind == nn::role::buffer ? dtype::fp32 : as;
    write(p.name, shape, v, t);
    for (const auto& [alias, of] : layout.aliases)
      if (of == p.name) write(alias, shape, v, t);
  }
  if (!writer) return;
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as safetensors writes it
  const std::uint64_t length = header.size();
  std::string file(reinterpret_cast<const char*>(&length), 8);
  write_file(path, file + header + data);
}

// Reads a safetensors file into `store`: every parameter and buffer of the
// store must be there with its shape (as `layout` lays it out), and nothing
// else but the layout's aliases; a bad file changes nothing.
template <Policy P, Backend B>
void import_safetensors(const std::string& path, nn::ParameterStore<P, B>& store, const TensorLayout& layout = {}) {
  std::ifstream f(path, std::ios::binary);
  AMP_REQUIRE(f, "cannot open safetensors file '", path, "'");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  AMP_REQUIRE(bytes.size() >= 8, "safetensors file '", path, "' is truncated: no header length");
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  AMP_REQUIRE(length <= bytes.size() - 8 && length <= (100u << 20), "safetensors file '", path, "' claims a header of ",
              length, " bytes; the file has ", bytes.size() - 8, " after the length");
  const detail::Json header = detail::JsonReader(std::string_view(bytes).substr(8, length), path).document();
  AMP_REQUIRE(header.k == detail::Json::kind::object, "safetensors file '", path, "': the header is not a JSON object");
  const std::string_view data = std::string_view(bytes).substr(8 + length);

  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  // The values of tensor `name`, which must have `want`'s shape.
  const auto read = [&](const std::string& name, const Shape& want, const char* owner) {
    const auto it = header.object.find(name);
    AMP_REQUIRE(it != header.object.end(), "safetensors file '", path, "' has no tensor '", name, "' (the ", owner, "'s ",
                want.str(), ")");
    const detail::Json& t = it->second;
    const auto field = [&](const char* key) -> const detail::Json& {
      const auto fd = t.object.find(key);
      AMP_REQUIRE(fd != t.object.end(), "safetensors file '", path, "': tensor '", name, "' has no ", key);
      return fd->second;
    };
    const detail::Json &type = field("dtype"), &shape = field("shape"), &offsets = field("data_offsets");
    std::string got = "[";
    bool same = shape.array.size() == static_cast<std::size_t>(want.rank());
    for (std::size_t d = 0; d < shape.array.size(); ++d) {
      if (d) got += 'x';
      got += std::to_string(shape.array[d].number);
      same = same && shape.array[d].number == want[static_cast<int>(d)];
    }
    AMP_REQUIRE(same, "safetensors file '", path, "': tensor '", name, "' has shape ", got, "], the ", owner, " ",
                want.str());
    const std::string& dt = type.text;
    const std::size_t width = dt == "F32" ? 4 : dt == "F16" || dt == "BF16" ? 2 : dt == "I64" ? 8 : 0;
    AMP_REQUIRE(width, "safetensors file '", path, "': tensor '", name, "' has dtype '", dt,
                "'; amp reads F32, F16, BF16 and I64");
    const auto count = static_cast<std::uint64_t>(want.numel());
    AMP_REQUIRE(offsets.array.size() == 2 && offsets.array[0].number >= 0 &&
                    offsets.array[0].number <= offsets.array[1].number &&
                    static_cast<std::uint64_t>(offsets.array[1].number) <= data.size() &&
                    static_cast<std::uint64_t>(offsets.array[1].number - offsets.array[0].number) == count * width,
                "safetensors file '", path, "': tensor '", name, "' has data offsets outside the file or of the "
                "wrong length");
    ranges.emplace_back(offsets.array[0].number, offsets.array[1].number);
    const char* src = data.data() + offsets.array[0].number;
    std::vector<float> v(count);
    for (std::size_t k = 0; k < count; ++k) {
      if (width == 4) std::memcpy(&v[k], src + 4 * k, 4);
      else if (width == 8) {
        std::int64_t x;
        std::memcpy(&x, src + 8 * k, 8);
        v[k] = static_cast<float>(x);
      } else {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * k, 2);
        v[k] = dt == "F16" ? cast<float>(amp::detail::half_from_bits(b)) : cast<float>(amp::detail::bfloat16_from_bits(b));
      }
    }
    return v;
  };

  const auto& table = store.table();
  std::vector<std::vector<float>> values(table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const nn::ParamInfo& p = table[i];
    const Shape shape = detail::file_shape(p, layout);
    const bool transposed = detail::stored_transposed(p, layout);
    values[i] = read(p.name, shape, transposed ? "model's, transposed," : "model");
    for (const auto& [alias, of] : layout.aliases)
      if (of == p.name && header.object.count(alias))
        AMP_REQUIRE(read(alias, shape, "model") == values[i], "safetensors file '", path, "': tensor '", alias,
                    "' differs from '", of, "', which the model ties it to");
    if (transposed) values[i] = detail::transposed(values[i], shape[0], shape[1]);
  }
  // As the format asks: the tensors cover the data exactly, without holes or overlaps.
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    AMP_REQUIRE(begin == covered, "safetensors file '", path, "': tensors overlap or leave a hole at byte ", covered);
    covered = end;
  }
  AMP_REQUIRE(covered == data.size(), "safetensors file '", path, "' has ", data.size() - covered,
              " bytes after its last tensor");
  for (const auto& [name, t] : header.object) {
    if (name == "__metadata__") continue;
    const bool known = std::any_of(table.begin(), table.end(), [&](const auto& p) { return p.name == name; }) ||
                       std::any_of(layout.aliases.begin(), layout.aliases.end(), [&](const auto& a) { return a.first == name; });
    AMP_REQUIRE(known, "safetensors file '", path, "' has tensor '", name, "', which the model does not have");
  }
  for (std::size_t i = 0; i < values.size(); ++i) store.set_values(static_cast<int>(i), values[i]);
}

}  // namespace amp::io
