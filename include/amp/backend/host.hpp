#pragma once
// The CPU backend: context, element-wise launches and reductions, CBLAS GEMM.
#include "amp/backend/host/algorithm.hpp"
#include "amp/backend/host/context.hpp"
#include "amp/backend/host/gemm.hpp"
#include "amp/backend/host/mirror.hpp"
