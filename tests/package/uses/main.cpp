// Each public layer header and the scaler's, used with only itself and the
// host backend's header (one translation unit each): a one-layer model runs
// forward and backward. A header that leans on another it does not include
// fails to build here.
#include <cstdio>

bool use_linear();
bool use_conv();
bool use_conv_transpose();
bool use_upsample();
bool use_norm();
bool use_pool();
bool use_activation();
bool use_shape_ops();
bool use_attention();
bool use_transformer();
bool use_scaler();

int main() {
  const struct {
    const char* header;
    bool (*use)();
  } uses[] = {{"nn/linear.hpp", use_linear},
              {"nn/conv.hpp", use_conv},
              {"nn/conv_transpose.hpp", use_conv_transpose},
              {"nn/upsample.hpp", use_upsample},
              {"nn/norm.hpp", use_norm},
              {"nn/pool.hpp", use_pool},
              {"nn/activation.hpp", use_activation},
              {"nn/shape_ops.hpp", use_shape_ops},
              {"nn/attention.hpp", use_attention},
              {"nn/transformer.hpp", use_transformer},
              {"scaling/loss_scaler.hpp", use_scaler}};
  int failed = 0;
  for (const auto& u : uses) {
    const bool ok = u.use();
    std::printf("%s %s\n", ok ? "used alone:" : "FAILED alone:", u.header);
    failed += ok ? 0 : 1;
  }
  return failed;
}
