#pragma once
// CUDA tests skip visibly where no GPU is present: the line below is what ctest
// matches (SKIP_REGULAR_EXPRESSION) and what scripts/test.sh lists, one line
// per distinct reason.
#include <iostream>

#include "amp/backend/cuda/context.cuh"

#define AMP_REQUIRE_GPU()                                                       \
  do {                                                                          \
    const std::string amp_reason_ = ::amp::cuda_unavailable_reason();           \
    if (!amp_reason_.empty()) {                                                 \
      std::cout << "[amp-skip] " << amp_reason_ << std::endl;                   \
      return;                                                                   \
    }                                                                           \
  } while (0)
