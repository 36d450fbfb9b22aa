#pragma once
// amp.hpp and the transformer layers: causal self-attention (cuDNN's fused
// attention under nvcc), the pre-norm block, GPT-2 and generation.
#include "amp/amp.hpp"
#include "amp/nn/attention.hpp"
#include "amp/nn/generate.hpp"
#include "amp/nn/gpt2.hpp"
#include "amp/nn/transformer.hpp"
