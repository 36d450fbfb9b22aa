#pragma once
// Stream capture, per backend (the CUDA one is in backend/cuda/graph.cuh). On
// the CPU, work runs as it is issued; while capturing, the context keeps each
// launch (a loop, a reduction, a GEMM, a copy) with its arguments instead
// (Context<host>::issue), and a replay runs those launches in order and
// nothing else. That is what a CUDA graph does, so a step that replays right
// here, bit for bit, reads every per-step value from backend memory as it
// must on a GPU.
#include <cstddef>
#include <functional>
#include <vector>

#include "amp/backend/host/context.hpp"

namespace amp {

template <Backend B>
class StreamGraph;

template <>
class StreamGraph<host> {
 public:
  void begin(Context<host>& ctx) {
    ops_.clear();
    ctx.record_into(&ops_);
  }
  void end(Context<host>& ctx) { ctx.record_into(nullptr); }
  void abort(Context<host>& ctx) {
    ctx.record_into(nullptr);
    ops_.clear();
  }
  void launch(Context<host>&) {
    for (auto& op : ops_) op();
  }
  // The recorded launches: the host's graph nodes.
  std::size_t nodes() const { return ops_.size(); }

 private:
  std::vector<std::function<void()>> ops_;
};

}  // namespace amp
