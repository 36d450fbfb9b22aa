#pragma once
// The CPU backend's context: a thread count and host memory, accounted like the GPU's.
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "amp/backend/backend.hpp"
#include "amp/backend/host/cpu.hpp"

namespace amp {

template <>
class Context<host> : public ContextBase<Context<host>> {
 public:
  static constexpr std::size_t alignment = 64;  // one cache line, one AVX-512 vector

  // threads = 0: AMP_NUM_THREADS or OMP_NUM_THREADS if set, else the CPUs
  // that are idle when the first context is made (see default_host_threads).
  explicit Context(int threads = 0) : threads_(threads > 0 ? threads : detail::default_host_threads()) {}
  ~Context() { release_scratch(); }

  int threads() const { return threads_; }
  // Every policy runs on the CPU (the GPU's context checks the device's support).
  template <class P>
  void require() const {}
  std::string_view device_name() const { return "cpu"; }
  const std::string& cpu_name() const { return detail::host_cpu().name; }

  // Runs f, a launch of the backend's work, now; or, while a step is being
  // captured, keeps it for each replay instead. A CUDA graph keeps every
  // kernel with the arguments it had at the capture, and so does this: a
  // replay runs the recorded launches alone, never the code that issued them,
  // so a value a kernel took by value is frozen here as on a GPU.
  template <class F>
  void issue(F&& f) {
    if (recording_) recording_->emplace_back(std::forward<F>(f));
    else f();
  }
  // Where issue() records (nullptr: nowhere; backend/host/graph.hpp sets it).
  void record_into(std::vector<std::function<void()>>* ops) { recording_ = ops; }

  // Every backend's work is in order on the calling thread here: a sync waits
  // for nothing, but is counted where the GPU's would wait (ContextBase).
 private:
  friend class ContextBase<Context<host>>;

  void* raw_allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p) fail("host allocation of ", bytes, " bytes failed");
    return p;
  }
  void raw_free(void* p) { std::free(p); }
  void* raw_allocate_pinned(std::size_t bytes) { return raw_allocate(bytes); }
  void raw_free_pinned(void* p) { std::free(p); }
  void raw_synchronize() {}
  void raw_copy_to_device(void* dst, const void* src, std::size_t bytes) {
    issue([=] { std::memcpy(dst, src, bytes); });
  }
  void raw_copy_to_host(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  void raw_copy(void* dst, const void* src, std::size_t bytes) {
    issue([=] { std::memcpy(dst, src, bytes); });
  }

  int threads_;
  std::vector<std::function<void()>>* recording_ = nullptr;
};

}  // namespace amp
