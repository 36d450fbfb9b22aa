#include <amp/backend/host.hpp>
#include <amp/nn/attention.hpp>

#include "one_layer.hpp"

bool use_attention() { return amp::test::run_one_layer<amp::nn::CausalSelfAttention>({.features = 4, .heads = 2}, amp::Shape{3, 4}); }
