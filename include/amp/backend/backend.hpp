#pragma once
// Backend tags and what every backend's Context shares: memory accounting by
// category and persistent scratch, so the training loop never allocates.
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "amp/core/error.hpp"

namespace amp {

struct host {
  static constexpr std::string_view name = "cpu";
};
struct cuda {
  static constexpr std::string_view name = "cuda";
};

template <class B>
concept Backend = std::is_same_v<B, host> || std::is_same_v<B, cuda>;

template <Backend B>
class Context;

// What a byte of memory is for; the demo's memory table has one column each.
// data: batches as a data loader holds them, before a model copies them in.
enum class memory_kind { weights, master, grads, optimizer, activations, workspace, data, count };

inline constexpr std::array<std::string_view, static_cast<std::size_t>(memory_kind::count)>
    memory_kind_names = {"weights", "master", "grads", "optimizer", "activations", "workspace", "data"};

class MemoryStats {
 public:
  static constexpr std::size_t kinds = static_cast<std::size_t>(memory_kind::count);

  void on_allocate(memory_kind k, std::size_t bytes) {
    auto& cur = current_[index(k)];
    cur += bytes;
    if (cur > peak_[index(k)]) peak_[index(k)] = cur;
    total_ += bytes;
    if (total_ > total_peak_) total_peak_ = total_;
    ++allocations_;
  }
  void on_free(memory_kind k, std::size_t bytes) {
    current_[index(k)] -= bytes;
    total_ -= bytes;
  }

  std::size_t current(memory_kind k) const { return current_[index(k)]; }
  std::size_t peak(memory_kind k) const { return peak_[index(k)]; }
  std::size_t current_total() const { return total_; }
  std::size_t peak_total() const { return total_peak_; }
  // Allocations made since the context was created; a training loop that
  // allocates shows up as a growing count.
  std::size_t allocations() const { return allocations_; }

 private:
  static std::size_t index(memory_kind k) { return static_cast<std::size_t>(k); }
  std::array<std::size_t, kinds> current_{};
  std::array<std::size_t, kinds> peak_{};
  std::size_t total_ = 0;
  std::size_t total_peak_ = 0;
  std::size_t allocations_ = 0;
};

// Named scratch regions; each grows to the largest request and then stays.
enum class scratch_slot { reduction, partials, gemm_a, gemm_b, gemm_c, bias_grad, loss_rows, count };

// Shared by Context<host> and Context<cuda>; Derived supplies raw_allocate/raw_free.
template <class Derived>
class ContextBase {
 public:
  ContextBase() = default;
  ContextBase(const ContextBase&) = delete;
  ContextBase& operator=(const ContextBase&) = delete;

  MemoryStats& memory() { return stats_; }
  const MemoryStats& memory() const { return stats_; }

  void* allocate(std::size_t bytes, memory_kind kind) {
    if (bytes == 0) return nullptr;
    void* p = self().raw_allocate(bytes);
    stats_.on_allocate(kind, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, memory_kind kind) {
    if (!p) return;
    self().raw_free(p);
    stats_.on_free(kind, bytes);
  }

  // Persistent scratch of at least `count` elements of T (workspace memory).
  template <class T>
  T* scratch(scratch_slot slot, std::size_t count) {
    auto& s = scratch_[static_cast<std::size_t>(slot)];
    const std::size_t bytes = count * sizeof(T);
    if (bytes > s.bytes) {
      self().synchronize();  // the old region may still be in use on the stream
      deallocate(s.ptr, s.bytes, memory_kind::workspace);
      s.ptr = allocate(bytes, memory_kind::workspace);
      s.bytes = bytes;
    }
    return static_cast<T*>(s.ptr);
  }

 protected:
  // Called by the derived destructor while raw_free is still valid.
  void release_scratch() {
    for (auto& s : scratch_) {
      deallocate(s.ptr, s.bytes, memory_kind::workspace);
      s = {};
    }
  }

 private:
  struct Region {
    void* ptr = nullptr;
    std::size_t bytes = 0;
  };
  Derived& self() { return static_cast<Derived&>(*this); }
  MemoryStats stats_;
  std::array<Region, static_cast<std::size_t>(scratch_slot::count)> scratch_{};
};

}  // namespace amp
