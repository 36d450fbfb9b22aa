#pragma once
// A point in a context's stream that the host can wait for: what reuse of a
// pinned staging buffer waits on (the copy that read it has run). On the CPU
// work has run when it is issued, so there is nothing to wait for.
#include "amp/backend/host/context.hpp"

namespace amp {

template <class B>
class Fence;

template <>
class Fence<host> {
 public:
  explicit Fence(Context<host>&) {}
  void record(Context<host>&) {}
  void wait() {}
};

}  // namespace amp
