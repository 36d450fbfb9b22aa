# What each amp component needs, found the same way by amp's own build and by
# an installed package (ampConfig.cmake): amp_find_dependencies(<components>).
include(CMakeFindDependencyMacro)
include(${CMAKE_CURRENT_LIST_DIR}/ampCuda20.cmake)

# Inside find_package(amp) a missing dependency makes amp "not found" with the
# reason; in amp's own build it stops the configure step.
macro(_amp_find name)
  if(CMAKE_FIND_PACKAGE_NAME STREQUAL "amp")
    find_dependency(${name} ${ARGN})
  else()
    find_package(${name} ${ARGN} REQUIRED)
  endif()
endmacro()

macro(amp_find_dependencies components)
  # core: CUDA's fp16/bf16 headers (the toolkit; no CUDA library is linked).
  _amp_find(CUDAToolkit)
  set(_amp_components ${components})
  if("host" IN_LIST _amp_components)
    _amp_find(OpenMP COMPONENTS CXX)
    # oneDNN: only its library. amp binds the few C functions it calls under its
    # own names (amp/backend/host/onednn.hpp), so no oneDNN header reaches users.
    if(NOT TARGET amp::onednn)
      find_library(AMP_ONEDNN_LIBRARY NAMES dnnl HINTS ${AMP_ONEDNN_DIR})
      if(NOT AMP_ONEDNN_LIBRARY)
        message(FATAL_ERROR "amp::host needs oneDNN's library (libdnnl). Install it with: "
                            "apt-get install libdnnl-dev (or set AMP_ONEDNN_DIR to the folder of libdnnl.so)")
      endif()
      add_library(amp::onednn UNKNOWN IMPORTED)
      set_target_properties(amp::onednn PROPERTIES IMPORTED_LOCATION "${AMP_ONEDNN_LIBRARY}")
    endif()
  endif()
  if("cuda" IN_LIST _amp_components)
    _amp_find(CCCL CONFIG HINTS "${CUDAToolkit_LIBRARY_DIR}/cmake")
  endif()
  if("data" IN_LIST _amp_components)
    _amp_find(ZLIB)
  endif()
  if("parallel" IN_LIST _amp_components)
    _amp_find(MPI COMPONENTS CXX)
    # NCCL ships with the CUDA toolkit kind amp targets; the GPU half of amp::parallel,
    # which an installed amp::parallel built with CUDA links even for a CPU-only consumer.
    if(("cuda" IN_LIST _amp_components OR AMP_PARALLEL_WITH_NCCL) AND NOT TARGET amp::nccl)
      find_library(AMP_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
      find_path(AMP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      if(NOT AMP_NCCL_LIBRARY OR NOT AMP_NCCL_INCLUDE_DIR)
        message(FATAL_ERROR "amp::parallel with CUDA needs NCCL (nccl.h and libnccl); install NVIDIA's libnccl-dev "
                            "or set AMP_NCCL_LIBRARY and AMP_NCCL_INCLUDE_DIR")
      endif()
      add_library(amp::nccl UNKNOWN IMPORTED)
      set_target_properties(amp::nccl PROPERTIES IMPORTED_LOCATION "${AMP_NCCL_LIBRARY}"
                                                 INTERFACE_INCLUDE_DIRECTORIES "${AMP_NCCL_INCLUDE_DIR}")
    endif()
  endif()
endmacro()
