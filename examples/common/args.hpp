#pragma once
// Command-line flags: "--flag value" or "--flag=value"; a yes/no switch also
// alone ("--summary" is "--summary yes"). Each flag is declared with its help
// line, so --help is always complete; an unknown flag, a missing value, a value
// that does not parse or is out of range is an error naming the flag and the value.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <amp/core/error.hpp>

namespace examples {

class Args {
 public:
  Args(std::string program, std::string about) : program_(std::move(program)), about_(std::move(about)) {}

  // `value_name` shows in --help: --epochs N.
  Args& flag(const std::string& name, std::string default_value, std::string help, std::string value_name = "VALUE") {
    order_.push_back(name);
    values_[name] = std::move(default_value);
    help_[name] = {std::move(help), std::move(value_name)};
    return *this;
  }

  // A yes/no switch: "--name", "--name yes|no" or "--name=yes|no".
  Args& toggle(const std::string& name, bool default_value, std::string help) {
    toggles_.push_back(name);
    return flag(name, default_value ? "yes" : "no", std::move(help), "[yes|no]");
  }

  // false when --help was asked for (and printed).
  bool parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        print_help();
        return false;
      }
      AMP_REQUIRE(arg.rfind("--", 0) == 0, "unexpected argument '", arg, "' (flags start with --; see --help)");
      const auto eq = arg.find('=');
      const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      AMP_REQUIRE(values_.count(name), "unknown flag '--", name, "' (see --help)");
      given_.insert(name);
      if (eq != std::string::npos) {
        values_[name] = arg.substr(eq + 1);
      } else if (is_toggle(name)) {  // the bare form, or a yes/no that follows
        const bool valued = i + 1 < argc && (std::string(argv[i + 1]) == "yes" || std::string(argv[i + 1]) == "no");
        values_[name] = valued ? argv[++i] : "yes";
      } else {
        AMP_REQUIRE(i + 1 < argc, "flag '--", name, "' needs a value: --", name, " ", help_[name].value_name,
                    " or --", name, "=", help_[name].value_name);
        values_[name] = argv[++i];
      }
    }
    return true;
  }

  const std::string& str(const std::string& name) const { return values_.at(name); }

  // A default known only after parsing (a checkpoint's): the flag takes it unless it was given.
  void default_to(const std::string& name, std::string value) {
    if (!given_.count(name)) values_.at(name) = std::move(value);
  }

  // A toggle's value.
  bool on(const std::string& name) const {
    const std::string& v = str(name);
    AMP_REQUIRE(v == "yes" || v == "no", "--", name, " must be yes or no, got '", v, "'");
    return v == "yes";
  }

  // An integer in [lo, hi], parsed in 64 bits: "4294967297" does not wrap to 1.
  long long integer(const std::string& name, long long lo, long long hi) const {
    const std::string& v = str(name);
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    const bool parsed = !v.empty() && end == v.c_str() + v.size() && errno == 0;
    AMP_REQUIRE(parsed && x >= lo && x <= hi, "--", name, " must be an integer in [", lo, ", ", hi, "], got '", v,
                "'");
    return x;
  }

  // A finite number in [lo, hi] (or (lo, hi] when lo_open).
  double real(const std::string& name, double lo, double hi, bool lo_open = false) const {
    const std::string& v = str(name);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    const bool parsed = !v.empty() && end == v.c_str() + v.size() && std::isfinite(x);
    const bool in_range = (lo_open ? x > lo : x >= lo) && x <= hi;
    AMP_REQUIRE(parsed && in_range, "--", name, " must be a number in ", lo_open ? "(" : "[", lo, ", ", hi, "], got '",
                v, "'");
    return x;
  }

 private:
  struct Help {
    std::string text, value_name;
  };

  bool is_toggle(const std::string& name) const {
    for (const auto& t : toggles_)
      if (t == name) return true;
    return false;
  }

  void print_help() const {
    std::printf("usage: %s [--flag VALUE | --flag=VALUE ...]\n%s\n\nflags:\n", program_.c_str(), about_.c_str());
    for (const auto& name : order_) {
      const auto& def = values_.at(name);
      const Help& h = help_.at(name);
      const std::string left = "--" + name + " " + h.value_name;
      std::printf("  %-24s %s%s\n", left.c_str(), h.text.c_str(), def.empty() ? "" : (" (default " + def + ")").c_str());
    }
  }

  std::string program_, about_;
  std::vector<std::string> order_, toggles_;
  std::map<std::string, std::string> values_;
  std::map<std::string, Help> help_;
  std::set<std::string> given_;
};

}  // namespace examples
