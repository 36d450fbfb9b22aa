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

// Host loops that run per-element functors are compiled three times, for
// x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA, F16C) and the baseline, and the
// loader picks one for the CPU at run time (GCC's target_clones). Inside them
// amp's fp16 casts are single F16C instructions and loops vectorise wider;
// flatten inlines the functor, so its casts see the clone's instruction set.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AMP_NO_HOST_CLONES)
#define AMP_HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define AMP_HOST_CLONES
#endif
