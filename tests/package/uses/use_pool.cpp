#include <amp/backend/host.hpp>
#include <amp/nn/pool.hpp>

#include "one_layer.hpp"

// Pools have no parameters: the run itself is the check.
bool use_pool() {
  return amp::test::run_one_layer<amp::nn::MaxPool2d>({.kernel = 2}, amp::Shape{4, 4, 2}) &&
         amp::test::run_one_layer<amp::nn::GlobalAvgPool>({}, amp::Shape{4, 4, 2});
}
