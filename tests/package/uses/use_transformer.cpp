#include <amp/backend/host.hpp>
#include <amp/nn/transformer.hpp>

#include "one_layer.hpp"

bool use_transformer() { return amp::test::run_one_layer<amp::nn::TransformerBlock>({.features = 4, .heads = 2}, amp::Shape{3, 4}); }
