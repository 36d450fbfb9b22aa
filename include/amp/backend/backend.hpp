#pragma once
// Backend tags and what every backend's Context shares: memory accounting by
// category and persistent scratch, so the training loop never allocates.
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

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
enum class scratch_slot {
  reduction, partials, gemm_a, gemm_b, gemm_c, gemm_a_wide, gemm_b_wide, bias_grad, loss_rows, conv, attention, fp8_amax, count
};

// What a captured step may not do, counted where shared code decides to do it,
// so the host's figures are the GPU's: host waits for the stream, backend
// allocations and frees (pinned staging included), copies between the device
// and pageable host memory (each one a hidden sync or staging copy in CUDA),
// and launches (for_each, reductions, GEMMs, as amp issues them; a replayed
// graph launches nothing one by one). A staging buffer's wait for its own copy
// of two batches ago (Staging, Fence) is back-pressure, not a sync: not counted.
struct Counters {
  std::size_t syncs = 0;
  std::size_t allocations = 0;
  std::size_t frees = 0;
  std::size_t pageable_copies = 0;
  std::size_t launches = 0;

  friend Counters operator-(const Counters& a, const Counters& b) {
    return {a.syncs - b.syncs, a.allocations - b.allocations, a.frees - b.frees,
            a.pageable_copies - b.pageable_copies, a.launches - b.launches};
  }
};

// What a context does with a captured step (amp::CapturedStep): records it
// (the GPU records into a CUDA graph, the CPU keeps each launch with its
// arguments) or replays it. In both a sync, an allocation or a pageable copy
// would break a CUDA graph, so each is an error on every backend.
enum class step_mode { eager, capturing, replaying };

// Where host memory of a copy lives: pinned memory lets the copy run
// asynchronously (and be recorded in a CUDA graph); pageable memory does not.
enum class host_memory { pageable, pinned };

// Shared by Context<host> and Context<cuda>; Derived supplies raw_allocate /
// raw_free / raw_allocate_pinned / raw_free_pinned, raw_synchronize and the
// raw copies, and this class decides (and counts) when each runs.
template <class Derived>
class ContextBase {
 public:
  ContextBase() = default;
  ContextBase(const ContextBase&) = delete;
  ContextBase& operator=(const ContextBase&) = delete;

  MemoryStats& memory() { return stats_; }
  const MemoryStats& memory() const { return stats_; }
  const Counters& counters() const { return counters_; }
  // Kernels and loops launched; the backends' launch functions call it.
  void count_launch(std::size_t n = 1) {
    if (mode_ != step_mode::replaying) counters_.launches += n;
  }

  step_mode mode() const { return mode_; }
  void set_mode(step_mode m) { mode_ = m; }
  // A captured step is being recorded or replayed: no sync, allocation or pageable copy.
  bool capturing() const { return mode_ != step_mode::eager; }
  // Host work a captured step must still do after each replay (a scaler's
  // look at its lagging mirror); registered while recording.
  void after_each_replay(std::function<void()> f) { after_replay_.push_back(std::move(f)); }
  std::vector<std::function<void()>> take_after_replay() { return std::exchange(after_replay_, {}); }
  // Host work that follows a step's device work and needs it done (a
  // scaler's look at its lagging mirror): now, or, while a step is being
  // captured, after each of its replays instead.
  void after_step_on_host(std::function<void()> f) {
    if (capturing()) after_each_replay(std::move(f));
    else f();
  }
  // Host bookkeeping of the work being issued (gradients written, weights
  // updated): now, and, while a step is being captured, again after each of
  // its replays (a recorded step runs no host code).
  void each_run_on_host(const std::function<void()>& f) {
    if (capturing()) after_each_replay(f);
    f();
  }
  // Scratch regions moved so far: a graph recorded before a move would read freed memory.
  std::size_t scratch_moves() const { return scratch_moves_; }

  void* allocate(std::size_t bytes, memory_kind kind) {
    if (bytes == 0) return nullptr;
    refuse_in_capture("allocates ", bytes, " bytes of ", memory_kind_names[static_cast<std::size_t>(kind)]);
    void* p = self().raw_allocate(bytes);
    stats_.on_allocate(kind, bytes);
    ++counters_.allocations;
    return p;
  }
  // A free while capturing is held, not done: on the GPU it would end the
  // capture with the runtime's error, and the graph may still read the memory.
  // The capture refuses such a step (it counts frees) and releases what was held.
  void deallocate(void* p, std::size_t bytes, memory_kind kind) {
    if (!p) return;
    ++counters_.frees;
    if (capturing()) return held_.push_back({p, bytes, kind, false});
    self().raw_free(p);
    stats_.on_free(kind, bytes);
  }
  // Page-locked host memory the device copies from asynchronously (staging).
  void* allocate_pinned(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    refuse_in_capture("allocates ", bytes, " bytes of pinned host memory");
    ++counters_.allocations;
    return self().raw_allocate_pinned(bytes);
  }
  void deallocate_pinned(void* p) {
    if (!p) return;
    ++counters_.frees;
    if (capturing()) return held_.push_back({p, 0, memory_kind::workspace, true});
    self().raw_free_pinned(p);
  }
  // Frees the memory whose free a capture held; called once the capture has ended.
  void release_held_frees() {
    for (const Held& h : std::exchange(held_, {})) {
      if (h.pinned) {
        self().raw_free_pinned(h.ptr);
      } else {
        self().raw_free(h.ptr);
        stats_.on_free(h.kind, h.bytes);
      }
    }
  }

  // Waits for all work on the stream.
  void synchronize() {
    refuse_in_capture("waits for the stream (a host sync)");
    ++counters_.syncs;
    self().raw_synchronize();
  }
  // Ordered on the stream; asynchronous from pinned memory.
  void copy_to_device(void* dst, const void* src, std::size_t bytes, host_memory from = host_memory::pageable) {
    if (!bytes) return;
    if (from == host_memory::pageable) {
      refuse_in_capture("copies ", bytes, " bytes from pageable host memory");
      ++counters_.pageable_copies;
    }
    self().raw_copy_to_device(dst, src, bytes);
  }
  // Returns when the bytes have landed: a sync.
  void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    refuse_in_capture("copies ", bytes, " bytes to the host (a host sync)");
    ++counters_.pageable_copies;
    self().raw_copy_to_host(dst, src, bytes);
    synchronize();
  }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) self().raw_copy(dst, src, bytes);
  }

  // What a library keeps for this context (oneDNN's engine, cuDNN's handle, the
  // plans made for their shapes), made on first use and freed with the context
  // in the reverse order: a state that makes the states it uses in its
  // constructor (plans, their handle) is freed before them.
  template <class State>
  State& library_state() {
    const std::type_index id(typeid(State));
    for (auto& [key, state] : library_state_)
      if (key == id) return *static_cast<State*>(state.get());
    auto state = std::make_shared<State>(self());
    library_state_.emplace_back(id, state);
    return *state;
  }

  // Persistent scratch of at least `count` elements of T (workspace memory).
  // It grows only while a model plans or its first steps run; a growth waits
  // for the stream, as the old region may still be in use there.
  template <class T>
  T* scratch(scratch_slot slot, std::size_t count) {
    auto& s = scratch_[static_cast<std::size_t>(slot)];
    const std::size_t bytes = count * sizeof(T);
    if (bytes > s.bytes) {
      synchronize();
      deallocate(s.ptr, s.bytes, memory_kind::workspace);
      s.ptr = allocate(bytes, memory_kind::workspace);
      s.bytes = bytes;
      ++scratch_moves_;
    }
    return static_cast<T*>(s.ptr);
  }

 protected:
  // Called by the derived destructor while raw_free and the stream are still valid.
  void release_scratch() {
    release_held_frees();
    while (!library_state_.empty()) library_state_.pop_back();
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
  struct Held {
    void* ptr;
    std::size_t bytes;
    memory_kind kind;
    bool pinned;
  };
  Derived& self() { return static_cast<Derived&>(*this); }
  template <class... Why>
  void refuse_in_capture(const Why&... why) const {
    if (capturing())
      fail("amp: a captured step ", why..., "; a CUDA graph cannot hold that. Run the step once eagerly first (it "
           "sizes every buffer), and move reads of results (item(), stats()) out of the captured body");
  }
  MemoryStats stats_;
  Counters counters_;
  step_mode mode_ = step_mode::eager;
  std::size_t scratch_moves_ = 0;
  std::vector<std::function<void()>> after_replay_;
  std::vector<Held> held_;
  std::array<Region, static_cast<std::size_t>(scratch_slot::count)> scratch_{};
  std::vector<std::pair<std::type_index, std::shared_ptr<void>>> library_state_;  // in the order made
};

}  // namespace amp
