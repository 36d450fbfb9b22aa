#pragma once
// A small JSON writer: objects and arrays nest by calls, strings are escaped,
// numbers keep 9 significant digits (enough for any float), and non-finite
// numbers (not JSON) are written as null.
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace examples {

class Json {
 public:
  Json& object() { return open('{'); }
  Json& array() { return open('['); }
  Json& end() {
    const char close = stack_.back() == '{' ? '}' : ']';
    stack_.pop_back();
    out_ += close;
    first_ = false;
    return *this;
  }
  Json& key(std::string_view k) {
    separate();
    string(k);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  Json& value(std::string_view v) {
    separate();
    string(v);
    return *this;
  }
  Json& value(const char* v) { return value(std::string_view(v)); }
  Json& value(const std::string& v) { return value(std::string_view(v)); }
  Json& value(bool v) { return raw(v ? "true" : "false"); }
  Json& value(double v) {
    if (!std::isfinite(v)) return raw("null");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return raw(buf);
  }
  Json& value(long long v) { return raw(std::to_string(v)); }
  Json& value(int v) { return value(static_cast<long long>(v)); }
  Json& value(unsigned long long v) { return raw(std::to_string(v)); }
  Json& value(unsigned long v) { return raw(std::to_string(v)); }
  Json& value(long v) { return value(static_cast<long long>(v)); }
  Json& value(float v) { return value(static_cast<double>(v)); }
  Json& null() { return raw("null"); }
  template <class T>
  Json& field(std::string_view k, const T& v) {
    return key(k).value(v);
  }

  const std::string& str() const { return out_; }

 private:
  Json& open(char c) {
    separate();
    out_ += c;
    stack_.push_back(c);
    first_ = true;
    return *this;
  }
  Json& raw(std::string_view text) {
    separate();
    out_ += text;
    return *this;
  }
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!stack_.empty() && !first_) out_ += ", ";
    first_ = false;
  }
  void string(std::string_view s) {
    out_ += '"';
    for (const char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\t': out_ += "\\t"; break;
        case '\r': out_ += "\\r"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out_ += buf;
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<char> stack_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace examples
