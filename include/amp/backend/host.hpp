#pragma once
// The CPU backend: context, element-wise launches and reductions, oneDNN GEMMs and convolutions.
#include "amp/backend/host/algorithm.hpp"
#include "amp/backend/host/attention.hpp"
#include "amp/backend/host/context.hpp"
#include "amp/backend/host/conv.hpp"
#include "amp/backend/host/fence.hpp"
#include "amp/backend/host/gemm.hpp"
#include "amp/backend/host/graph.hpp"
#include "amp/backend/host/mirror.hpp"
