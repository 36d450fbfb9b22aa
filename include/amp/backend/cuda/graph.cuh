#pragma once
// Stream capture on the GPU: everything issued on the context's stream between
// begin() and end() becomes one CUDA graph (cuBLAS, cuBLASLt, CUB, NCCL and
// amp's kernels are all capturable), instantiated once and launched per step.
// Thread-local capture mode: a call from this thread that cannot be captured
// fails the capture instead of running unseen.
#include <cstddef>

#include "amp/backend/cuda/context.cuh"
#include "amp/backend/host/graph.hpp"

namespace amp {

template <>
class StreamGraph<cuda> {
 public:
  StreamGraph() = default;
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  ~StreamGraph() { release(); }

  void begin(Context<cuda>& ctx) {
    release();
    ctx.activate();
    AMP_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
  }
  void end(Context<cuda>& ctx) {
    AMP_CUDA_CHECK(cudaStreamEndCapture(ctx.stream(), &graph_));
    AMP_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes_));
    AMP_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  // Ends a capture that failed, leaving the stream usable.
  void abort(Context<cuda>& ctx) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(ctx.stream(), &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  void launch(Context<cuda>& ctx) {
    ctx.activate();
    AMP_CUDA_CHECK(cudaGraphLaunch(exec_, ctx.stream()));
  }
  std::size_t nodes() const { return nodes_; }

 private:
  void release() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr, graph_ = nullptr, nodes_ = 0;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace amp
