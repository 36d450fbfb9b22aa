// Whether the package gave this consumer cuDNN's C++ frontend (else attention
// on the GPU takes the materialised path): run.cmake checks the answer.
#include <amp/backend/cuda/attention.cuh>

#include <cstdio>

int main() {
  std::printf("cuDNN attention: %s\n", amp::fused_attention<amp::cuda>::value ? "yes" : "no");
  return 0;
}
