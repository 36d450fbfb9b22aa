#pragma once
// The CPU backend's context: a thread count and host memory, accounted like the GPU's.
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "amp/backend/backend.hpp"

namespace amp {

template <>
class Context<host> : public ContextBase<Context<host>> {
 public:
  static constexpr std::size_t alignment = 64;  // one cache line, one AVX-512 vector

  // threads = 0: all the threads OpenMP offers.
  explicit Context(int threads = 0) : threads_(threads > 0 ? threads : default_threads()) {}
  ~Context() { release_scratch(); }

  int threads() const { return threads_; }
  // bf16 GEMMs on AMX where the CPU has it (default); off: widen to fp32 and sgemm.
  bool native_bf16() const { return native_bf16_; }
  void set_native_bf16(bool on) { native_bf16_ = on; }
  std::string_view device_name() const { return "cpu"; }

  void synchronize() {}

  void copy_to_device(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }

 private:
  friend class ContextBase<Context<host>>;

  static int default_threads() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
  }
  void* raw_allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, rounded);
    if (!p) fail("host allocation of ", bytes, " bytes failed");
    return p;
  }
  void raw_free(void* p) { std::free(p); }

  int threads_;
  bool native_bf16_ = true;
};

}  // namespace amp
