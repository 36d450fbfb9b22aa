#pragma once
// NCCL for amp's GPU backend: a Collective over device memory, one GPU per
// rank, bootstrapped over MPI (rank 0's unique id is broadcast). Every NCCL
// call goes on one communication stream, in the order the host issues them
// (NCCL needs the same order on every rank); events order it after the
// context's queued work, and the context's next work after it, so gradient
// buckets travel while the context's stream goes on with backward.
#if !defined(__CUDACC__)
#error "amp/parallel/nccl.cuh needs nvcc"
#endif
#include <nccl.h>

#include <chrono>
#include <thread>
#include <utility>

#include "amp/backend/cuda.cuh"
#include "amp/parallel/mpi.hpp"

namespace amp::parallel {

namespace detail {
inline void nccl_check(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess) fail("NCCL: ", call, " failed: ", ncclGetErrorString(rc));
}
inline ncclDataType_t nccl_type(element t) {
  return t == element::fp32 ? ncclFloat32 : t == element::fp16 ? ncclFloat16 : ncclBfloat16;
}
}  // namespace detail

class NcclCommunicator final : public Collective<cuda> {
 public:
  // Collective: every rank constructs it with its own context (its GPU).
  NcclCommunicator(MpiCommunicator& bootstrap, Context<cuda>& ctx) : bootstrap_(&bootstrap) {
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast_bytes(&id, sizeof id, 0);
    AMP_CUDA_CHECK(cudaSetDevice(ctx.device()));
    detail::nccl_check(ncclCommInitRank(&comm_, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
    AMP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    AMP_CUDA_CHECK(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming));
    AMP_CUDA_CHECK(cudaEventCreateWithFlags(&landed_, cudaEventDisableTiming));
  }
  ~NcclCommunicator() override {
    if (std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm_);  // a failed rank: do not wait for the others
    } else {
      amp::detail::report_in_destructor("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
      ncclCommDestroy(comm_);
    }
    cudaEventDestroy(queued_);
    cudaEventDestroy(landed_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }

  void all_reduce_sum(Context<cuda>& ctx, void* data, std::size_t count, element type) override {
    start_all_reduce_sum(ctx, data, count, type);
    finish(ctx);
  }
  void start_all_reduce_sum(Context<cuda>& ctx, void* data, std::size_t count, element type) override {
    start_all_reduce(ctx, data, count, type, ncclSum);
  }
  void start_all_reduce_max(Context<cuda>& ctx, float* data, std::size_t count) override {
    start_all_reduce(ctx, data, count, element::fp32, ncclMax);
  }
  void finish(Context<cuda>& ctx) override {
    if (!pending_) return;
    if (group_depth_ > 0) {  // a group's calls reach the stream at its end: landed after that
      finish_after_group_ = &ctx;
      return;
    }
    AMP_CUDA_CHECK(cudaEventRecord(landed_, stream_));
    AMP_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), landed_, 0));
    pending_ = false;
  }
  void start_reduce_sum(Context<cuda>& ctx, void* data, std::size_t count, element type, int root) override {
    after_queued_work(ctx);
    detail::nccl_check(ncclReduce(data, data, count, detail::nccl_type(type), ncclSum, root, comm_, stream_),
                       "ncclReduce");
    pending_ = true;
  }
  void all_gather(Context<cuda>& ctx, void* data, std::size_t bytes) override {
    after_queued_work(ctx);
    char* slots = static_cast<char*>(data);
    detail::nccl_check(ncclAllGather(slots + static_cast<std::size_t>(rank()) * bytes, slots, bytes, ncclUint8, comm_, stream_),
                       "ncclAllGather");
    pending_ = true;
    finish(ctx);
  }
  void broadcast(Context<cuda>& ctx, void* data, std::size_t bytes, int root) override {
    after_queued_work(ctx);
    detail::nccl_check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    pending_ = true;
    finish(ctx);
  }
  std::vector<std::int64_t> all_gather(std::int64_t value) override { return bootstrap_->all_gather(value); }
  // One NCCL launch for the calls in between (ncclGroupStart / ncclGroupEnd).
  void group_start() override {
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
    ++group_depth_;
  }
  void group_end() override {
    detail::nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    if (--group_depth_ == 0 && finish_after_group_) finish(*std::exchange(finish_after_group_, nullptr));
  }

  // Waits for every queued NCCL call, at most `timeout`: a rank that stopped
  // shows up as an error here (the communicator is aborted), not as a hang.
  void synchronize(std::chrono::seconds timeout = std::chrono::seconds(300)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      ncclResult_t async = ncclSuccess;
      detail::nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess) {
        ncclCommAbort(comm_);
        fail("NCCL: rank ", rank(), ": a collective failed: ", ncclGetErrorString(async));
      }
      if (amp::detail::cuda_ready(cudaStreamQuery(stream_), "cudaStreamQuery (NCCL's stream)")) return;
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        fail("NCCL: rank ", rank(), ": no progress for ", timeout.count(),
             " s: another rank failed or stopped calling collectives");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  void start_all_reduce(Context<cuda>& ctx, void* data, std::size_t count, element type, ncclRedOp_t reduction) {
    after_queued_work(ctx);
    detail::nccl_check(ncclAllReduce(data, data, count, detail::nccl_type(type), reduction, comm_, stream_),
                       "ncclAllReduce");
    pending_ = true;
  }
  void after_queued_work(Context<cuda>& ctx) {
    AMP_CUDA_CHECK(cudaEventRecord(queued_, ctx.stream()));
    AMP_CUDA_CHECK(cudaStreamWaitEvent(stream_, queued_, 0));
  }

  MpiCommunicator* bootstrap_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t queued_ = nullptr, landed_ = nullptr;
  bool pending_ = false;
  int group_depth_ = 0;
  Context<cuda>* finish_after_group_ = nullptr;  // a finish() asked for inside a group
};

}  // namespace amp::parallel
