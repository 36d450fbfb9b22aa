// Times cblas_sgemm on the shapes of the demo's MLP (batch 128: 784-256-128-10,
// forward and both backward products), in GFLOP/s. Linked once per CBLAS by
// bench/compare-cblas.sh to choose the host backend's default.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <vector>

int main() {
  struct Shape { int m, n, k; bool ta, tb; const char* what; };
  const Shape shapes[] = {
      {128, 256, 784, false, true, "fwd 784->256"}, {128, 128, 256, false, true, "fwd 256->128"},
      {256, 784, 128, true, false, "dW 256x784"},   {128, 784, 256, false, false, "dX 128x784"},
      {1024, 1024, 1024, false, false, "square 1024"},
  };
  double total_flop = 0, total_s = 0;
  for (const Shape& s : shapes) {
    std::vector<float> a(size_t(s.m) * s.k, 0.5f), b(size_t(s.k) * s.n, 0.25f), c(size_t(s.m) * s.n);
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    auto run = [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n,
                  s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
    };
    for (int i = 0; i < 5; ++i) run();
    const int reps = s.m * s.n * s.k > 100000000 ? 20 : 400;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) run();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double flop = 2.0 * s.m * s.n * s.k * reps;
    if (s.m < 1024) { total_flop += flop; total_s += sec; }
    std::printf("  %-14s %8.1f GFLOP/s\n", s.what, flop / sec * 1e-9);
  }
  std::printf("  MLP shapes overall %8.1f GFLOP/s\n", total_flop / total_s * 1e-9);
}
