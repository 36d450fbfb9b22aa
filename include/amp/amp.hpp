#pragma once
// amp: automatic mixed-precision training, resolved at compile time.
// Include this one header; the CUDA backend comes along when compiled by nvcc.
#include "amp/backend/arena.hpp"
#include "amp/backend/host.hpp"
#include "amp/policy.hpp"
#include "amp/tensor.hpp"
#if defined(__CUDACC__)
#include "amp/backend/cuda.cuh"
#endif
