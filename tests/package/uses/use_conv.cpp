#include <amp/backend/host.hpp>
#include <amp/nn/conv.hpp>

#include "one_layer.hpp"

bool use_conv() { return amp::test::run_one_layer<amp::nn::Conv2d>({.in_channels = 2, .out_channels = 3, .padding = 1}, amp::Shape{4, 4, 2}); }
