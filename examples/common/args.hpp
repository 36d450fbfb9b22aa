#pragma once
// A small "--flag value" parser: each flag is declared with its help line, so
// --help is always complete and an unknown or valueless flag is an error.
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <amp/core/error.hpp>

namespace examples {

class Args {
 public:
  Args(std::string program, std::string about) : program_(std::move(program)), about_(std::move(about)) {}

  Args& flag(const std::string& name, std::string default_value, std::string help) {
    order_.push_back(name);
    values_[name] = std::move(default_value);
    help_[name] = std::move(help);
    return *this;
  }

  // false when --help was asked for (and printed).
  bool parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        print_help();
        return false;
      }
      AMP_REQUIRE(arg.rfind("--", 0) == 0 && values_.count(arg.substr(2)), "unknown argument '", arg,
                  "' (see --help)");
      AMP_REQUIRE(i + 1 < argc, "argument '", arg, "' needs a value (see --help)");
      values_[arg.substr(2)] = argv[++i];
    }
    return true;
  }

  const std::string& str(const std::string& name) const { return values_.at(name); }
  long integer(const std::string& name) const {
    return parsed(name, "an integer", [](const std::string& v, std::size_t* used) { return std::stol(v, used); });
  }
  float real(const std::string& name) const {
    return parsed(name, "a number", [](const std::string& v, std::size_t* used) { return std::stof(v, used); });
  }

 private:
  // The whole value must parse; "12x" or "" is an error naming the flag.
  template <class Parse>
  std::invoke_result_t<Parse, const std::string&, std::size_t*> parsed(const std::string& name, const char* what,
                                                                   Parse parse) const {
    try {
      std::size_t used = 0;
      const auto v = parse(str(name), &used);
      if (used == str(name).size()) return v;
    } catch (const std::exception&) {
    }
    amp::fail("--", name, " expects ", what, ", got '", str(name), "'");
  }

  void print_help() const {
    std::printf("usage: %s [flags]\n%s\n\nflags:\n", program_.c_str(), about_.c_str());
    for (const auto& name : order_) {
      const auto& def = values_.at(name);
      std::printf("  --%-14s %s%s\n", name.c_str(), help_.at(name).c_str(),
                  def.empty() ? "" : (" (default " + def + ")").c_str());
    }
  }
  std::string program_, about_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> values_, help_;
};

}  // namespace examples
