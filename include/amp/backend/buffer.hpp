#pragma once
// RAII backend memory. Copying is deleted (a copy of GPU memory is never an
// accident worth allowing); buffers move. Every byte is counted by its context.
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/backend.hpp"
#include "amp/core/span.hpp"

namespace amp {

template <class T, Backend B>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Context<B>& ctx, std::size_t count, memory_kind kind)
      : ctx_(&ctx), data_(static_cast<T*>(ctx.allocate(count * sizeof(T), kind))), size_(count), kind_(kind) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer(std::move(other)).swap(*this);
    return *this;
  }
  ~Buffer() {
    if (ctx_) ctx_->deallocate(data_, size_ * sizeof(T), kind_);
  }

  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  memory_kind kind() const { return kind_; }
  Span<T> span() const { return {data_, size_}; }
  Context<B>& context() const { return *ctx_; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(kind_, o.kind_);
  }
  Context<B>* ctx_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  memory_kind kind_ = memory_kind::workspace;
};

// Page-locked host memory of `count` T, for staging what the device reads:
// a copy from it is asynchronous, and a CUDA graph can record it (the graph
// reads the memory when it replays). Plain host memory on the CPU backend,
// counted the same.
template <class T, Backend B>
class PinnedBuffer {
 public:
  static_assert(std::is_trivially_copyable_v<T>);
  PinnedBuffer() = default;
  PinnedBuffer(Context<B>& ctx, std::size_t count)
      : ctx_(&ctx), data_(static_cast<T*>(ctx.allocate_pinned(count * sizeof(T)))), size_(count) {}
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept { swap(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    PinnedBuffer(std::move(o)).swap(*this);
    return *this;
  }
  ~PinnedBuffer() {
    if (ctx_) ctx_->deallocate_pinned(data_);
  }

  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  Span<T> span() const { return {data_, size_}; }

 private:
  void swap(PinnedBuffer& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  Context<B>* ctx_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Host <-> backend transfers; `download` waits for the stream, `upload` is
// ordered on it (and asynchronous from a PinnedBuffer).
template <class T, Backend B>
void upload(Context<B>& ctx, Span<T> dst, const T* src, std::size_t count) {
  AMP_REQUIRE(count <= dst.size, "upload: ", count, " elements do not fit a buffer of ", dst.size);
  ctx.copy_to_device(dst.data, src, count * sizeof(T));
}

template <class T, Backend B>
void upload(Context<B>& ctx, Span<T> dst, const PinnedBuffer<T, B>& src, std::size_t count) {
  AMP_REQUIRE(count <= dst.size && count <= src.size(), "upload: ", count, " elements from a staging buffer of ",
              src.size(), " into a buffer of ", dst.size);
  ctx.copy_to_device(dst.data, src.data(), count * sizeof(T), host_memory::pinned);
}

template <class T, Backend B>
void upload(Context<B>& ctx, Span<T> dst, const std::vector<T>& src) {
  upload(ctx, dst, src.data(), src.size());
}

template <class T, Backend B>
std::vector<std::remove_const_t<T>> download(Context<B>& ctx, Span<T> src) {
  std::vector<std::remove_const_t<T>> out(src.size);
  ctx.copy_to_host(out.data(), src.data, src.size * sizeof(T));
  return out;
}

template <class T, Backend B>
T download_one(Context<B>& ctx, const T* src) {
  T out;
  ctx.copy_to_host(&out, src, sizeof(T));
  return out;
}

}  // namespace amp
