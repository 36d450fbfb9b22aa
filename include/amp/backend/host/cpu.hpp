#pragma once
// What the host CPU offers, read once: its name, the vector extensions amp's
// conversion kernels choose between at run time, and how many of its cores are
// free for this process now (the default thread count).
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace amp::detail {

struct HostCpu {
  std::string name;
  bool f16c = false;     // 8-wide fp16 <-> fp32 conversion (vcvtph2ps / vcvtps2ph)
  bool avx512f = false;  // the same 16 wide
  bool avx512_bf16 = false;
};

inline const HostCpu& host_cpu() {
  static const HostCpu cpu = [] {
    HostCpu c;
    std::ifstream info("/proc/cpuinfo");
    for (std::string line; std::getline(info, line);)
      if (line.rfind("model name", 0) == 0) {
        c.name = line.substr(line.find(':') + 2);
        break;
      }
#if defined(__x86_64__)
    c.f16c = __builtin_cpu_supports("f16c");
    c.avx512f = c.f16c && __builtin_cpu_supports("avx512f");
    c.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    return c;
  }();
  return cpu;
}

// CPUs this process may run on (its affinity mask).
inline int allowed_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// Tasks other than this one that are runnable now: the fewest of a few
// readings of /proc/loadavg's "running" field, so a passing task does not count.
inline int busy_cpus() {
  int fewest = 1 << 20;
  for (int reading = 0; reading < 5; ++reading) {
    std::FILE* f = std::fopen("/proc/loadavg", "r");
    if (!f) return 0;
    int running = 0, total = 0;
    const bool ok = std::fscanf(f, "%*f %*f %*f %d/%d", &running, &total) == 2;
    std::fclose(f);
    if (!ok) return 0;
    fewest = std::min(fewest, running - 1);  // minus this thread
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return std::max(0, fewest);
}

// The default thread count of Context<host>: AMP_NUM_THREADS or OMP_NUM_THREADS
// when set, else the CPUs that are not busy now (at least 1). OpenMP threads
// that share a core with another busy process wait for each other at every
// barrier; on a loaded 2-core machine two threads ran 2.6x slower than one.
inline int default_host_threads() {
  static const int threads = [] {
    for (const char* var : {"AMP_NUM_THREADS", "OMP_NUM_THREADS"})
      if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);
#if defined(_OPENMP)
    const int available = std::min(omp_get_max_threads(), allowed_cpus());
#else
    const int available = 1;
#endif
    return std::clamp(available - busy_cpus(), 1, std::max(1, available));
  }();
  return threads;
}

// oneDNN runs on OpenMP's thread count: make it the context's before a call.
inline void use_threads(int threads) {
#if defined(_OPENMP)
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

}  // namespace amp::detail
