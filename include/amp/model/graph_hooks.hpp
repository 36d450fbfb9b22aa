#pragma once
// The ops that reach into a graph's tape: a fused loss writes its gradient
// over the logits (the op that made them allows it), and activation
// checkpointing drops a segment's tape and replays it in backward. Not the
// surface a layer's author writes against (model/graph.hpp is).
#include <utility>

#include "amp/model/graph.hpp"

namespace amp::nn::detail {

struct GraphHooks {
  template <class G, class U>
  static void allow_overwrite(G& g, const Var<U>& v) {
    g.allow_overwrite(v);
  }
  // A closure recorded after v's op that reads v's gradient only (the
  // numerics report's) leaves v as overwritable as it was.
  template <class G, class U>
  static void still_overwritable(G& g, const Var<U>& v) {
    if (g.overwritable_ == v.data) g.allow_overwrite(v);
  }
  template <class G, class U>
  static void overwrite(G& g, const Var<U>& v, const char* who) {
    g.overwrite(v, who);
  }
  template <class G>
  static auto begin_segment(const G& g) {
    return g.begin_segment();
  }
  template <class G, class S>
  static void drop_segment(G& g, const S& s) {
    g.drop_segment(s);
  }
  template <class G, class S, class F>
  static void replay(G& g, const S& s, F&& forward) {
    g.replay(s, std::forward<F>(forward));
  }
  template <class G, class U>
  static void seed_grad(G& g, const Var<U>& v, const U* grad) {
    g.seed_grad(v, grad);
  }
};

}  // namespace amp::nn::detail
