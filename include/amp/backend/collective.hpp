#pragma once
// Collective communication among the ranks of a data-parallel job, as the
// layers below amp::parallel see it: SyncBatchNorm sums its statistics, the
// gradient reducer sums gradients and takes the maximum of FP8 amaxes through
// this interface, and amp::parallel implements it on MPI (host memory) and
// NCCL (device memory). Work is ordered like any other op of a context: after
// what the context has queued, before what it queues next. On the host every
// call has landed when it returns, except the start_ calls, which land at finish().
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "amp/backend/backend.hpp"
#include "amp/core/numeric.hpp"
#include "amp/core/span.hpp"

namespace amp {

// The element types a collective sums.
enum class element { fp32, fp16, bf16 };

template <class T>
constexpr element element_of() {
  if constexpr (std::is_same_v<T, float>) return element::fp32;
  else if constexpr (std::is_same_v<T, half>) return element::fp16;
  else {
    static_assert(std::is_same_v<T, bfloat16>, "collectives sum fp32, fp16 or bf16");
    return element::bf16;
  }
}
inline constexpr std::size_t element_size(element e) { return e == element::fp32 ? 4 : 2; }
inline constexpr std::string_view element_name(element e) {
  return e == element::fp32 ? "fp32" : e == element::fp16 ? "fp16" : "bf16";
}

template <Backend B>
class Collective {
 public:
  Collective() = default;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[0, count) becomes the sum over ranks, in its own type (each addition
  // rounded to it; every rank gets the same bits).
  virtual void all_reduce_sum(Context<B>& ctx, void* data, std::size_t count, element type) = 0;
  // The same, started now and landed by finish(): gradient buckets travel while backward goes on.
  virtual void start_all_reduce_sum(Context<B>& ctx, void* data, std::size_t count, element type) = 0;
  // data[0, count) becomes the maximum over ranks, started now and landed by
  // finish() (FP8 amaxes travel with the gradients). Exact: every rank gets
  // the largest rank's bits, whatever the order (no NaN in data).
  virtual void start_all_reduce_max(Context<B>& ctx, float* data, std::size_t count) = 0;
  // Every started reduction has landed (for the context's next work).
  virtual void finish(Context<B>& ctx) = 0;
  // Lets started reductions progress (engines that move data only inside their calls).
  virtual void progress() {}
  // data[0, count) on root becomes the sum over ranks (elsewhere unchanged),
  // started now and landed by finish(): ZeRO-1 sends each gradient to the
  // rank that keeps its shard.
  virtual void start_reduce_sum(Context<B>& ctx, void* data, std::size_t count, element type, int root) = 0;
  // The calls between group_start() and group_end() go out as one (NCCL's
  // group: ZeRO-1's reduces of a bucket, its broadcasts of the shards); every
  // rank groups alike. No-ops where calls are not batched (MPI).
  virtual void group_start() {}
  virtual void group_end() {}
  // root's bytes to every rank.
  virtual void broadcast(Context<B>& ctx, void* data, std::size_t bytes, int root) = 0;
  // data holds size() slots of `bytes` each; rank r's slot r goes to every rank
  // (ZeRO-1's ranks share their gradient statistics).
  virtual void all_gather(Context<B>& ctx, void* data, std::size_t bytes) = 0;
  // One host value from every rank: result[r] is rank r's (set-up checks).
  virtual std::vector<std::int64_t> all_gather(std::int64_t value) = 0;

  template <class T>
  void all_reduce_sum(Context<B>& ctx, Span<T> data) {
    all_reduce_sum(ctx, data.data, data.size, element_of<T>());
  }
};

}  // namespace amp
