#pragma once
// amp::Error is the one exception type of the library; its message names what
// failed (the call, the shapes, the file) so the user never has to guess.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace amp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  throw Error(detail::concat(std::forward<Parts>(parts)...));
}

}  // namespace amp

// AMP_REQUIRE(cond, "what", value, ...): throws amp::Error with the parts joined.
#define AMP_REQUIRE(cond, ...)              \
  do {                                      \
    if (!(cond)) ::amp::fail(__VA_ARGS__);  \
  } while (0)
