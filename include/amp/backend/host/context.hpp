#pragma once
// The CPU backend's context: a thread count and host memory, accounted like the GPU's.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

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
  std::string_view device_name() const { return "cpu"; }
  const std::string& cpu_name() const { return detail::host_cpu().name; }

  void synchronize() {}

  void copy_to_device(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }

 private:
  friend class ContextBase<Context<host>>;

  void* raw_allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p) fail("host allocation of ", bytes, " bytes failed");
    return p;
  }
  void raw_free(void* p) { std::free(p); }

  int threads_;
};

}  // namespace amp
