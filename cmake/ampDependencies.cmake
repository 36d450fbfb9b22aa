# What each amp component needs, found the same way by amp's own build and by
# an installed package (ampConfig.cmake): amp_find_dependencies(<components>).
include(CMakeFindDependencyMacro)
set(_amp_dependencies_dir ${CMAKE_CURRENT_LIST_DIR})  # a macro's CMAKE_CURRENT_LIST_DIR is its caller's
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
    # cuDNN (convolutions): beside the toolkit's libraries, or where AMP_CUDNN_DIR says.
    if(NOT TARGET amp::cudnn)
      find_library(AMP_CUDNN_LIBRARY NAMES cudnn HINTS ${AMP_CUDNN_DIR} ${AMP_CUDNN_DIR}/lib ${CUDAToolkit_LIBRARY_DIR})
      find_path(AMP_CUDNN_INCLUDE_DIR cudnn.h HINTS ${AMP_CUDNN_DIR} ${AMP_CUDNN_DIR}/include ${CUDAToolkit_INCLUDE_DIRS})
      if(NOT AMP_CUDNN_LIBRARY OR NOT AMP_CUDNN_INCLUDE_DIR)
        message(FATAL_ERROR "amp::cuda needs cuDNN 9 (cudnn.h and libcudnn); install NVIDIA's cudnn9-cuda package "
                            "or set AMP_CUDNN_DIR to its folder")
      endif()
      # cuDNN's C++ frontend (header-only; NVIDIA's PyPI package nvidia-cudnn-frontend ships it, and
      # scripts/setup.sh unpacks it into .deps/): fused attention's graphs, and only them. Without it the
      # attention layers take their materialised path (backend/cuda/attention.cuh asks __has_include).
      # Looked for where amp's build found it (an installed package's hint), then beside amp's sources.
      if(AMP_CUDNN_FRONTEND_DIR AND NOT EXISTS "${AMP_CUDNN_FRONTEND_DIR}/cudnn_frontend.h")
        unset(AMP_CUDNN_FRONTEND_DIR CACHE)  # found once, gone since (a removed .deps/): look again
      endif()
      find_path(AMP_CUDNN_FRONTEND_DIR cudnn_frontend.h
                HINTS ${_amp_frontend_hint} ${_amp_dependencies_dir}/../.deps/cudnn-frontend-1.32.0/include)
      set(_amp_cudnn_includes ${AMP_CUDNN_INCLUDE_DIR})
      set(_amp_cudnn_links)
      if(AMP_CUDNN_FRONTEND_DIR)
        # NVRTC by its file: CUDA::nvrtc also links the driver (libcuda.so.1), which a machine without a GPU
        # lacks, and every amp binary must start there (its GPU tests skip). The frontend's runtime fusion needs it.
        find_library(AMP_NVRTC_LIBRARY NAMES nvrtc HINTS ${CUDAToolkit_LIBRARY_DIR})
        if(NOT AMP_NVRTC_LIBRARY)
          message(FATAL_ERROR "amp::cuda needs the CUDA toolkit's NVRTC (libnvrtc) for cuDNN's frontend")
        endif()
        list(APPEND _amp_cudnn_includes ${AMP_CUDNN_FRONTEND_DIR})
        set(_amp_cudnn_links ${AMP_NVRTC_LIBRARY})
      elseif(NOT amp_FIND_QUIETLY)
        message(STATUS "amp: cuDNN's C++ frontend (cudnn_frontend.h) not found: attention on the GPU takes the "
                       "materialised path, not cuDNN's fused kernel. To have it: run scripts/setup.sh, or pip "
                       "download nvidia-cudnn-frontend==1.32.0 and set AMP_CUDNN_FRONTEND_DIR to its include folder")
      endif()
      add_library(amp::cudnn UNKNOWN IMPORTED)
      set_target_properties(amp::cudnn PROPERTIES IMPORTED_LOCATION "${AMP_CUDNN_LIBRARY}"
                            INTERFACE_INCLUDE_DIRECTORIES "${_amp_cudnn_includes}"
                            INTERFACE_LINK_LIBRARIES "${_amp_cudnn_links}")
    endif()
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
