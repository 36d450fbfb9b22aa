# Default CUDA architectures: a short list (Hopper) plus the GPU present, if any,
# so a build on 2 cores stays quick. Set CMAKE_CUDA_ARCHITECTURES to override.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(_amp_archs 90)
  find_program(_amp_nvidia_smi nvidia-smi)
  if(_amp_nvidia_smi)
    execute_process(COMMAND "${_amp_nvidia_smi}" --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE _amp_caps RESULT_VARIABLE _amp_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_amp_rc EQUAL 0 AND _amp_caps)
      string(REPLACE "." "" _amp_caps "${_amp_caps}")
      string(REPLACE "\n" ";" _amp_caps "${_amp_caps}")
      list(APPEND _amp_archs ${_amp_caps})
    endif()
  endif()
  list(REMOVE_DUPLICATES _amp_archs)
  set(CMAKE_CUDA_ARCHITECTURES "${_amp_archs}" CACHE STRING "CUDA architectures to build for")
endif()
