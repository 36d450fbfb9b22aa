#pragma once
// A flat arena: one allocation, many aligned typed sub-allocations. All
// parameters of a model live in one per role, so the overflow check and the
// optimizer step are single passes over a single buffer.
#include <cstddef>
#include <string_view>

#include "amp/backend/buffer.hpp"
#include "amp/core/traits.hpp"

namespace amp {

// Where a typed block sits inside an arena.
template <class T>
struct Slot {
  std::size_t offset = 0;  // bytes from the arena's start
  std::size_t count = 0;   // elements
};

// Plans the blocks before the single allocation happens.
class ArenaLayout {
 public:
  static constexpr std::size_t alignment = 256;  // what cuBLAS and vector loads like best

  template <class T>
  Slot<T> add(std::size_t count) {
    bytes_ = (bytes_ + alignment - 1) / alignment * alignment;
    Slot<T> slot{bytes_, count};
    bytes_ += count * sizeof(T);
    return slot;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

template <Backend B>
class Arena {
 public:
  Arena() = default;
  Arena(Context<B>& ctx, const ArenaLayout& layout, memory_kind kind) : storage_(ctx, layout.bytes(), kind) {}

  // The block's view; a slot from another layout that falls outside is refused.
  template <class T>
  Span<T> view(Slot<T> slot) const {
    AMP_REQUIRE(slot.offset % alignof(T) == 0, "arena: slot offset ", slot.offset, " is not aligned for ",
                type_name<T>());
    AMP_REQUIRE(slot.offset + slot.count * sizeof(T) <= storage_.bytes(), "arena: slot [", slot.offset, ", ",
                slot.offset + slot.count * sizeof(T), ") bytes is outside the arena of ", storage_.bytes(),
                " bytes");
    return {reinterpret_cast<T*>(storage_.data() + slot.offset), slot.count};
  }

  std::size_t bytes() const { return storage_.bytes(); }
  std::byte* data() const { return storage_.data(); }

 private:
  Buffer<std::byte, B> storage_;
};

}  // namespace amp
