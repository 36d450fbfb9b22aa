# What amp::amp needs, found the same way by the build tree and by an installed
# package (ampConfig.cmake includes this file).
include(CMakeFindDependencyMacro)

find_dependency(CUDAToolkit)
find_dependency(CCCL CONFIG HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
find_dependency(OpenMP COMPONENTS CXX)
find_dependency(ZLIB)

# The host GEMM's CBLAS: OpenBLAS (default, measured faster here) or BLIS.
set(AMP_HOST_BLAS "${AMP_HOST_BLAS}" CACHE STRING "CBLAS of the host backend: OpenBLAS or BLIS")
if(NOT AMP_HOST_BLAS)
  set(AMP_HOST_BLAS OpenBLAS CACHE STRING "CBLAS of the host backend: OpenBLAS or BLIS" FORCE)
endif()
set_property(CACHE AMP_HOST_BLAS PROPERTY STRINGS OpenBLAS BLIS)

if(NOT TARGET amp::cblas)
  # OpenBLAS's OpenMP build shares our OpenMP thread pool; its pthread build
  # spins against it (measured: 2x slower steps on 2 cores).
  find_path(AMP_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-openmp openblas-pthread openblas)
  if(AMP_HOST_BLAS STREQUAL "BLIS")
    find_library(AMP_CBLAS_LIBRARY NAMES blis PATH_SUFFIXES blis-openmp)
  else()
    find_library(AMP_CBLAS_LIBRARY NAMES openblas PATH_SUFFIXES openblas-openmp)
  endif()
  if(NOT AMP_CBLAS_INCLUDE_DIR OR NOT AMP_CBLAS_LIBRARY)
    message(FATAL_ERROR "amp: no CBLAS found for AMP_HOST_BLAS=${AMP_HOST_BLAS} "
                        "(header: ${AMP_CBLAS_INCLUDE_DIR}, library: ${AMP_CBLAS_LIBRARY}). "
                        "Install it with: apt-get install libopenblas-openmp-dev (or libblis-dev)")
  endif()
  add_library(amp::cblas UNKNOWN IMPORTED)
  set_target_properties(amp::cblas PROPERTIES
    IMPORTED_LOCATION "${AMP_CBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${AMP_CBLAS_INCLUDE_DIR}")
endif()
