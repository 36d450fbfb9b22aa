#pragma once
// Batches on their way to the device: two pinned host buffers used in turn, so
// filling the next batch neither copies from pageable memory nor waits for
// the stream. Reusing a buffer waits only for the copy that last read it, two
// batches ago (long done unless the device is two steps behind: that wait is
// the loop's back-pressure, not a sync of the stream). The copy lands in the
// caller's fixed device buffer, where a captured step reads each new batch.
//
//   Staging<float, B> stage(ctx, batch_values);
//   Span<float> host = stage.next();   // fill it
//   stage.upload(x.span(), n);         // asynchronous, ordered on the stream
#include <cstddef>

#include "amp/backend/buffer.hpp"
#include "amp/backend/host/fence.hpp"

namespace amp {

template <class T, Backend B>
class Staging {
 public:
  Staging(Context<B>& ctx, std::size_t count) : ctx_(&ctx), sides_{Side(ctx, count), Side(ctx, count)} {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // The host buffer to fill with the next batch, once its last copy has run.
  Span<T> next() {
    current_ = next_;
    next_ ^= 1;
    Side& s = sides_[current_];
    s.fence.wait();
    return s.values.span();
  }
  // Its first `count` values into dst, asynchronously on the context's stream.
  void upload(Span<T> dst, std::size_t count) {
    Side& s = sides_[current_];
    amp::upload(*ctx_, dst, s.values, count);
    s.fence.record(*ctx_);
  }
  std::size_t size() const { return sides_[0].values.size(); }

 private:
  struct Side {
    Side(Context<B>& ctx, std::size_t count) : values(ctx, count), fence(ctx) {}
    PinnedBuffer<T, B> values;
    Fence<B> fence;
  };
  Context<B>* ctx_;
  Side sides_[2];
  int next_ = 0, current_ = 0;
};

}  // namespace amp
