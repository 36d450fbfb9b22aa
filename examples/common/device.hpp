#pragma once
// For programs of one translation unit: the device choice and a level's
// context together (the per-level examples split them: common/levels.hpp in
// main, common/context.hpp in the levels' units).
#include "common/context.hpp"
#include "common/levels.hpp"

namespace examples {

// fn(ctx) with a fresh GPU or CPU context: for programs of one translation unit.
template <class Fn>
void with_context(bool gpu, int threads, Fn&& fn) {
  with_backend(gpu, [&]<amp::Backend B>() { with_context<B>(threads, fn); });
}

}  // namespace examples
