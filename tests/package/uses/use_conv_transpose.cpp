#include <amp/backend/host.hpp>
#include <amp/nn/conv_transpose.hpp>

#include "one_layer.hpp"

bool use_conv_transpose() {
  return amp::test::run_one_layer<amp::nn::ConvTranspose2d>(
      {.in_channels = 2, .out_channels = 3, .stride = 2, .padding = 1, .output_padding = 1}, amp::Shape{4, 4, 2});
}
