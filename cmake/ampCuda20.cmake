# CMake 3.25 does not know nvcc's C++20 flag, so a target with CUDA_STANDARD 20
# got no -std at all. Teach it (newer CMake versions know it and keep theirs).
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0
   AND NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  # A cache entry, so that the projects above an add_subdirectory(amp) see it too.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20" CACHE INTERNAL "nvcc's C++20 flag")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20" CACHE INTERNAL "nvcc's C++20 flag")
endif()
