#pragma once
// amp::parallel: data-parallel training over MPI (host memory) and, under
// nvcc, NCCL (device memory). Link the amp::parallel target; it brings MPI
// (and NCCL) in, and nothing else of amp needs them.
#include "amp/parallel/data_parallel.hpp"
#include "amp/parallel/mpi.hpp"
#if defined(__CUDACC__)
#include "amp/parallel/nccl.cuh"
#endif
