#pragma once
// Host/device qualifiers in one place (CUTLASS style): every per-element functor
// is written once and compiled for both backends.

#if defined(__CUDACC__)
#define AMP_HOST_DEVICE __host__ __device__
#define AMP_DEVICE __device__
#else
#define AMP_HOST_DEVICE
#define AMP_DEVICE
#endif

// True while compiling device code; host twins of intrinsics sit behind it.
#if defined(__CUDA_ARCH__)
#define AMP_DEVICE_CODE 1
#else
#define AMP_DEVICE_CODE 0
#endif

#define AMP_STRINGIFY_IMPL(x) #x
#define AMP_STRINGIFY(x) AMP_STRINGIFY_IMPL(x)
