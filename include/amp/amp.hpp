#pragma once
// amp: automatic mixed-precision training, resolved at compile time.
// Include this one header; the CUDA backend comes along when compiled by nvcc.
// Attention and the GPT-2 family are <amp/transformer.hpp>: under nvcc they
// bring cuDNN's frontend, which doubles a translation unit's compile time, so
// only the programs that use them pay for it.
// Data sets and files are components of their own (they need zlib; CMake's
// amp::data): <amp/data/loader.hpp> for amp::data (read_idx_pair, Loader),
// <amp/io/checkpoint.hpp> and <amp/io/safetensors.hpp> for amp::io.
#include "amp/backend/algorithm.hpp"
#include "amp/backend/host.hpp"
#include "amp/backend/staging.hpp"
#include "amp/capture.hpp"
#include "amp/policy.hpp"
#include "amp/tensor.hpp"
#if defined(__CUDACC__)
#include "amp/backend/cuda.cuh"
#endif
#include "amp/model/model.hpp"
#include "amp/nn/activation.hpp"
#include "amp/nn/conv.hpp"
#include "amp/nn/conv_transpose.hpp"
#include "amp/nn/embedding.hpp"
#include "amp/nn/fused_cross_entropy.hpp"
#include "amp/nn/checkpoint.hpp"
#include "amp/nn/linear.hpp"
#include "amp/nn/loss.hpp"
#include "amp/nn/norm.hpp"
#include "amp/nn/pool.hpp"
#include "amp/nn/sequential.hpp"
#include "amp/nn/shape_ops.hpp"
#include "amp/nn/upsample.hpp"
#include "amp/optim/adam.hpp"
#include "amp/optim/lamb.hpp"
#include "amp/optim/schedule.hpp"
#include "amp/optim/sgd.hpp"
#include "amp/scaling/loss_scaler.hpp"
#include "amp/train.hpp"
#include "amp/version.hpp"
