#pragma once
// amp: automatic mixed-precision training, resolved at compile time.
// Include this one header; the CUDA backend comes along when compiled by nvcc.
#include "amp/backend/algorithm.hpp"
#include "amp/backend/host.hpp"
#include "amp/policy.hpp"
#include "amp/tensor.hpp"
#if defined(__CUDACC__)
#include "amp/backend/cuda.cuh"
#endif
#include "amp/model/model.hpp"
#include "amp/nn/activation.hpp"
#include "amp/nn/attention.hpp"
#include "amp/nn/conv.hpp"
#include "amp/nn/embedding.hpp"
#include "amp/nn/linear.hpp"
#include "amp/nn/loss.hpp"
#include "amp/nn/norm.hpp"
#include "amp/nn/pool.hpp"
#include "amp/nn/sequential.hpp"
#include "amp/nn/shape_ops.hpp"
#include "amp/nn/transformer.hpp"
#include "amp/optim/adam.hpp"
#include "amp/optim/schedule.hpp"
#include "amp/optim/sgd.hpp"
#include "amp/scaling/loss_scaler.hpp"
#include "amp/train.hpp"
#include "amp/version.hpp"
