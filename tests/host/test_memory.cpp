#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "amp/amp.hpp"

using namespace amp;

static_assert(!std::is_copy_constructible_v<Buffer<float, host>>);
static_assert(!std::is_copy_assignable_v<Buffer<float, host>>);
static_assert(std::is_nothrow_move_constructible_v<Buffer<float, host>>);

TEST_CASE("buffers count bytes by category and move without copying") {
  Context<host> ctx;
  const auto& mem = ctx.memory();
  {
    Buffer<float, host> w(ctx, 1000, memory_kind::weights);
    Buffer<half, host> g(ctx, 1000, memory_kind::grads);
    CHECK(mem.current(memory_kind::weights) == 4000);
    CHECK(mem.current(memory_kind::grads) == 2000);
    CHECK(mem.current_total() == 6000);
    CHECK(mem.allocations() == 2);

    Buffer<float, host> moved(std::move(w));
    CHECK(moved.size() == 1000);
    CHECK(w.data() == nullptr);
    CHECK(mem.allocations() == 2);  // a move allocates nothing
    CHECK(mem.current(memory_kind::weights) == 4000);

    Buffer<float, host> other(ctx, 10, memory_kind::weights);
    other = std::move(moved);  // frees other's 40 bytes
    CHECK(mem.current(memory_kind::weights) == 4000);
    CHECK(mem.peak(memory_kind::weights) == 4040);
  }
  CHECK(mem.current_total() == 0);
  CHECK(mem.peak_total() == 6040);
}

TEST_CASE("arena blocks are aligned and bounds-checked") {
  Context<host> ctx;
  ArenaLayout layout;
  const auto a = layout.add<half>(3);     // 6 bytes
  const auto b = layout.add<float>(5);
  const auto c = layout.add<amp::bfloat16>(1);
  CHECK(a.offset == 0);
  CHECK(b.offset == 256);
  CHECK(c.offset == 512);
  CHECK(layout.bytes() == 514);

  Arena<host> arena(ctx, layout, memory_kind::weights);
  CHECK(ctx.memory().allocations() == 1);  // one allocation for all blocks
  CHECK(ctx.memory().current(memory_kind::weights) == 514);
  const Span<float> vb = arena.view(b);
  CHECK(reinterpret_cast<std::uintptr_t>(vb.data) % 64 == 0);
  CHECK(vb.size == 5);
  for (std::size_t i = 0; i < vb.size; ++i) vb[i] = static_cast<float>(i);
  CHECK(arena.view(b)[4] == 4.0f);

  const Slot<float> outside{512, 10};
  CHECK_THROWS_WITH_AS(arena.view(outside), doctest::Contains("outside the arena of 514 bytes"), Error);
  const Slot<float> misaligned{2, 1};
  CHECK_THROWS_WITH_AS(arena.view(misaligned), doctest::Contains("not aligned for fp32"), Error);
}

TEST_CASE("scratch grows to the largest request, then stays") {
  Context<host> ctx;
  float* p = ctx.scratch<float>(scratch_slot::gemm_a, 100);
  CHECK(ctx.memory().current(memory_kind::workspace) == 400);
  const auto allocs = ctx.memory().allocations();
  CHECK(ctx.scratch<float>(scratch_slot::gemm_a, 50) == p);
  CHECK(ctx.scratch<float>(scratch_slot::gemm_a, 100) == p);
  CHECK(ctx.memory().allocations() == allocs);
  ctx.scratch<float>(scratch_slot::gemm_a, 200);
  CHECK(ctx.memory().current(memory_kind::workspace) == 800);
  CHECK(ctx.memory().allocations() == allocs + 1);
}

TEST_CASE("tensors, shapes and transfers") {
  Context<host> ctx;
  Tensor<float, host> t(ctx, {4, 3}, memory_kind::activations);
  CHECK(t.shape().str() == "[4x3]");
  CHECK(t.shape().rows() == 4);
  CHECK(t.matrix().cols == 3);
  CHECK(Shape{2, 3, 5}.rows() == 6);
  CHECK_THROWS_WITH_AS((Shape{1, 2, 3, 4, 5}), doctest::Contains("rank 5 exceeds 4"), Error);
  CHECK_THROWS_WITH_AS((Shape{2, -1}), doctest::Contains("negative dimension -1"), Error);

  const std::vector<float> src{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  upload(ctx, t.span(), src);
  CHECK(download(ctx, Span<const float>(t.span())) == src);
  CHECK(t.matrix().first_rows(2).size() == 6);
  const std::vector<float> too_many(13, 0.0f);
  CHECK_THROWS_WITH_AS(upload(ctx, t.span(), too_many), doctest::Contains("13 elements do not fit"), Error);
}
