#pragma once
// A host-readable copy of a small device value that never blocks the stream.
// On the CPU the value is already host memory: the mirror reads it directly.
// On the GPU (backend/cuda/mirror.cuh) a copy lands a step or so later; the
// bookkeeping of that lag is MirrorSlot's, shared here so the CPU tests can
// drive it with a query that answers "not yet".
#include "amp/backend/host/context.hpp"

namespace amp {

namespace detail {

// At most one copy in flight. take() is called at each refresh with `landed`
// (asked only while a copy is in flight: has it landed?) and `staged` (where
// it lands); it keeps a landed value and says whether a new copy may start.
// A copy still in flight is kept, not replaced: the value read is at worst
// older, never torn.
template <class T>
class MirrorSlot {
 public:
  template <class Landed>
  bool take(Landed&& landed, const T& staged) {
    if (in_flight_ && landed()) {
      value_ = staged;
      has_value_ = true;
      in_flight_ = false;
    }
    if (in_flight_) return false;
    in_flight_ = true;
    return true;
  }
  const T* latest() const { return has_value_ ? &value_ : nullptr; }
  bool in_flight() const { return in_flight_; }

 private:
  T value_{};
  bool in_flight_ = false, has_value_ = false;
};

}  // namespace detail

template <class T, Backend B>
class Mirror;

template <class T>
class Mirror<T, host> {
 public:
  explicit Mirror(Context<host>&) {}
  void refresh(Context<host>&, const T* src) { latest_ = src; }
  // The newest value whose copy has completed, or nullptr if none has yet.
  const T* latest() const { return latest_; }

 private:
  const T* latest_ = nullptr;
};

}  // namespace amp
