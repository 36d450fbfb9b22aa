// amp's public headers add no global names beyond CUDA's own: a user may take
// amp's names into the global namespace, and use the names third-party C
// headers like to claim (OpenBLAS's cblas.h once declared ::bfloat16).
#include <amp/amp.hpp>
#include <amp/data/idx.hpp>
#include <amp/data/loader.hpp>
#include <amp/io/file.hpp>

#include <cstdio>

using amp::bfloat16;
using amp::half;
using amp::Policy;
using amp::Shape;
using amp::Tensor;

// Names C libraries commonly declare at global scope.
using bfloat16_t = int;
struct blasint {};
enum CBLAS_ORDER { CblasRowMajor };
struct dnnl_status_t {};
namespace dnnl {}
namespace cblas {}

int main() {
  const half h = amp::cast<half>(1.5f);
  const bfloat16 b = amp::cast<bfloat16>(2.5f);
  static_assert(Policy<amp::O2Policy>);
  std::printf("no global names leak: %g %g\n", amp::cast<float>(h), amp::cast<float>(b));
  return amp::cast<float>(h) + amp::cast<float>(b) == 4.0f ? 0 : 1;
}
