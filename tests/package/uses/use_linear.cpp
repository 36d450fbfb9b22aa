#include <amp/backend/host.hpp>
#include <amp/nn/linear.hpp>

#include "one_layer.hpp"

bool use_linear() { return amp::test::run_one_layer<amp::nn::Linear>({.in_features = 3, .out_features = 2, .act = amp::activation::gelu}, amp::Shape{3}); }
