#pragma once
// Activation checkpointing (torch.utils.checkpoint, Megatron's recompute):
//   y = nn::checkpoint(g, block, x);
// runs block(g, x), then keeps only its output: the block's activations and
// backward closures are given back at once (in evaluation too, so a deep
// model's forward needs one block's memory, not all of them). Backward runs the block's forward
// again from x (the same dropout masks, no running statistics counted twice),
// then its backward, and gives that memory back too. Gradients are the plain
// run's, bit for bit; the cost is one more forward of the block.
//
// `block` is a layer or any callable (Graph&, Var) -> Var whose only
// differentiable input is x (a layer's parameters are fine: they are not
// graph tensors). The backward keeps a copy of it when it is an rvalue or
// trivially copyable (a lambda of pointers and handles), else a reference: a
// layer, which must outlive the iteration (a model's layers do).
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

#include "amp/model/graph.hpp"
#include "amp/model/graph_hooks.hpp"

namespace amp::nn {

template <Policy P, Backend B, class Block, class U>
auto checkpoint(Graph<P, B>& g, Block&& block, Var<U> x) {
  using Out = decltype(block(g, x));
  using V = std::remove_pointer_t<decltype(Out{}.data)>;
  g.require_current(x, "checkpoint");
  auto fn = [&] {
    if constexpr (std::is_lvalue_reference_v<Block> && !std::is_trivially_copyable_v<std::decay_t<Block>>)
      return std::ref(block);
    else return std::decay_t<Block>(std::move(block));
  }();

  const auto segment = detail::GraphHooks::begin_segment(g);
  const Var<V> inner = fn(g, x);
  AMP_REQUIRE(inner.data != static_cast<const void*>(x.data), "checkpoint: the block returned its input");
  detail::GraphHooks::drop_segment(g, segment);
  // The output takes the segment's place; where it would overlap the block's
  // output (a block that allocated less than its output before it), after it.
  const auto at = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const std::size_t bytes = inner.size() * sizeof(V);
  Var<V> y = g.template tensor<V>(inner.shape);
  if (y.data != inner.data && at(y.data) < at(inner.data) + bytes && at(inner.data) < at(y.data) + bytes) {
    g.template scratch<std::byte>(at(inner.data) + bytes - at(y.data));
    y = g.template tensor<V>(inner.shape);
  }
  // The planning pass's memory is given back for real: its values are zeros, not to be read.
  if (g.planning()) fill(g.context(), y.span(), cast<V>(0.0f));
  else if (y.data != inner.data) convert(g.context(), Span<const V>(inner.span()), y.span());
  if (!g.training()) return y;  // evaluation: the memory saved, no backward to come

  g.on_backward([=](Graph<P, B>& gb) {
    const V* dy = gb.grad(y);
    if (!dy) return;
    const GradOut<U> dx = gb.grad_out(x);  // claimed before the replay, whose memory is given back
    if (dx && !dx.accumulate) fill(gb.context(), Span<U>(dx.data, x.size()), cast<U>(0.0f));
    detail::GraphHooks::replay(gb, segment, [&] {
      const Var<V> again = fn(gb, x);
      detail::GraphHooks::seed_grad(gb, again, dy);
    });
  });
  return y;
}

}  // namespace amp::nn
