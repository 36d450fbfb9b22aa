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
  CHECK_THROWS_WITH_AS((Shape{1, 2, 3, 4, 5, 6}), doctest::Contains("rank 6 exceeds 5"), Error);
  CHECK(Shape{28, 28, 1}.batched(64) == Shape{64, 28, 28, 1});
  CHECK(Shape{64, 28, 28, 1}.sample() == Shape{28, 28, 1});
  CHECK(Shape{4, 5, 6}.with(-1, 7) == Shape{4, 5, 7});
  CHECK_THROWS_WITH_AS((Shape{2, -1}), doctest::Contains("negative dimension -1"), Error);

  const std::vector<float> src{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  upload(ctx, t.span(), src);
  CHECK(download(ctx, Span<const float>(t.span())) == src);
  CHECK(t.matrix().first_rows(2).size() == 6);
  const std::vector<float> too_many(13, 0.0f);
  CHECK_THROWS_WITH_AS(upload(ctx, t.span(), too_many), doctest::Contains("13 elements do not fit"), Error);
}

TEST_CASE("a model's graph memory is planned at build: the steps allocate nothing, and temporaries are reused") {
  Context<host> ctx;
  nn::Sequential<O2Policy, host, nn::Conv2d, nn::MaxPool2d, nn::Flatten, nn::Linear> model(
      ctx, {.max_batch = 8, .seed = 1, .inputs = {{Shape{6, 6, 2}}}}, {.in_channels = 2, .out_channels = 4, .padding = 1},
      {}, {}, {.in_features = 36, .out_features = 3});
  const std::size_t planned = model.graph().arena_bytes();
  CHECK(planned > 0);
  CHECK(ctx.memory().current(memory_kind::activations) >= planned);
  std::vector<float> x(8 * 6 * 6 * 2, 0.5f);
  std::vector<std::int32_t> y(8, 1);
  const auto allocations = ctx.memory().allocations();
  for (const std::int64_t batch : {8, 3, 8}) {
    auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{batch, 6, 6, 2}));
    auto loss = nn::cross_entropy(ctx, out, Span<const std::int32_t>(y.data(), static_cast<std::size_t>(batch)));
    loss.backward();
    CHECK(model.graph().bytes_in_use() <= planned);
  }
  CHECK(ctx.memory().allocations() == allocations);
  CHECK_THROWS_WITH_AS(model.forward(ctx, TensorView<const float>(x.data(), Shape{9, 6, 6, 2})),
                       doctest::Contains("batch in 1..8"), Error);
  CHECK_THROWS_WITH_AS(model.forward(ctx, TensorView<const float>(x.data(), Shape{4, 6, 6, 3})),
                       doctest::Contains("input 0 has shape [4x6x6x3]"), Error);
}
