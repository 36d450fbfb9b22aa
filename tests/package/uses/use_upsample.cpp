#include <amp/backend/host.hpp>
#include <amp/nn/upsample.hpp>

#include "one_layer.hpp"

bool use_upsample() { return amp::test::run_one_layer<amp::nn::Upsample>({.scale = 2}, amp::Shape{3, 3, 2}); }
