#include <amp/backend/host.hpp>
#include <amp/nn/norm.hpp>

#include "one_layer.hpp"

bool use_norm() {
  return amp::test::run_one_layer<amp::nn::BatchNorm>({.features = 3}, amp::Shape{2, 3}) &&
         amp::test::run_one_layer<amp::nn::LayerNorm>({.features = 3}, amp::Shape{3});
}
