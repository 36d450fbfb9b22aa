#pragma once
// The GPU backend (compile with nvcc): context, launches, CUB reductions, cuBLAS GEMM, cuDNN convolution.
// cuDNN attention (backend/cuda/attention.cuh) comes with nn/attention.hpp, its only user.
#if !defined(__CUDACC__)
#error "amp/backend/cuda.cuh needs nvcc; include amp/amp.hpp, which adds it only under nvcc"
#endif
#include "amp/backend/cuda/algorithm.cuh"
#include "amp/backend/cuda/context.cuh"
#include "amp/backend/cuda/conv.cuh"
#include "amp/backend/cuda/fence.cuh"
#include "amp/backend/cuda/gemm.cuh"
#include "amp/backend/cuda/graph.cuh"
#include "amp/backend/cuda/mirror.cuh"
