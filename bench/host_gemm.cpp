// GFLOP/s of the host GEMMs on the demo's shapes (batch 128: 784-256-128-10,
// forward and both backward products): oneDNN's sgemm and bf16 GEMM, which amp
// uses, against OpenBLAS's sgemm, which amp used before. Built and run by
// bench/host_gemm.sh.
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <amp/backend/host/cpu.hpp>
#include <amp/backend/host/onednn.hpp>

int main() {
  struct Shape { int m, n, k; bool ta, tb; const char* what; };
  const Shape shapes[] = {
      {128, 256, 784, false, true, "fwd 784->256"}, {128, 128, 256, false, true, "fwd 256->128"},
      {256, 784, 128, true, false, "dW 256x784"},   {128, 784, 256, false, false, "dX 128x784"},
      {128, 10, 128, false, true, "fwd 128->10"},
  };
  const char* names[] = {"OpenBLAS sgemm", "oneDNN sgemm", "oneDNN bf16"};
  std::printf("CPU: %s; oneDNN %s, %s kernels\n", amp::detail::host_cpu().name.c_str(),
              amp::detail::onednn::version_string().c_str(), amp::detail::onednn::isa_name());
  std::printf("%-14s %16s %16s %16s  [GFLOP/s]\n", "shape", names[0], names[1], names[2]);
  double flop_total = 0, seconds[3] = {};
  for (const Shape& s : shapes) {
    std::vector<float> a(std::size_t(s.m) * s.k, 0.5f), b(std::size_t(s.k) * s.n, 0.25f), c(std::size_t(s.m) * s.n);
    std::vector<std::uint16_t> ah(a.size(), 0x3f00), bh(b.size(), 0x3e80);  // 0.5, 0.25 in bf16
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const char ta = s.ta ? 'T' : 'N', tb = s.tb ? 'T' : 'N';
    const int reps = 400;
    flop_total += 2.0 * s.m * s.n * s.k * reps;
    std::printf("%-14s", s.what);
    for (int impl = 0; impl < 3; ++impl) {
      auto run = [&] {
        if (impl == 0)
          cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k,
                      1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
        else if (impl == 1)
          amp::detail::onednn::sgemm(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
        else
          amp::detail::onednn::gemm_bf16bf16f32(ta, tb, s.m, s.n, s.k, 1.0f, ah.data(), lda, bh.data(), ldb, 0.0f,
                                                c.data(), s.n);
      };
      for (int i = 0; i < 20; ++i) run();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) run();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      seconds[impl] += sec;
      std::printf(" %16.1f", 2.0 * s.m * s.n * s.k * reps / sec * 1e-9);
    }
    std::printf("\n");
  }
  std::printf("%-14s %16.1f %16.1f %16.1f\n", "all shapes", flop_total / seconds[0] * 1e-9,
              flop_total / seconds[1] * 1e-9, flop_total / seconds[2] * 1e-9);
}
