#include <amp/backend/host.hpp>
#include <amp/nn/shape_ops.hpp>

#include "one_layer.hpp"

bool use_shape_ops() {
  return amp::test::run_one_layer<amp::nn::Flatten>({}, amp::Shape{2, 2, 3}) &&
         amp::test::run_one_layer<amp::nn::Unflatten>({.channels = 3, .height = 2, .width = 2}, amp::Shape{12}) &&
         amp::test::run_one_layer<amp::nn::Dropout>({.p = 0.5f}, amp::Shape{6});
}
