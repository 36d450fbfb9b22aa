#include <amp/backend/host.hpp>
#include <amp/nn/activation.hpp>

#include "one_layer.hpp"

bool use_activation() { return amp::test::run_one_layer<amp::nn::GELU>({}, amp::Shape{5}); }
