#pragma once
// A host-readable copy of a small device value that never blocks the stream.
// On the CPU the value is already host memory: the mirror reads it directly.
#include "amp/backend/host/context.hpp"

namespace amp {

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
