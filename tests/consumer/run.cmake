# Builds and runs the consumer projects against amp (cmake -P):
#   install      cmake --install, then find_package: the consumer without and with
#                its own C++20 standard, the CPU-only consumer (plain g++, host), and
#                one consumer per component set a user asks for (CXX alone without cuda)
#   subdirectory add_subdirectory(amp)
#   no-nvcc      amp's own build with no CUDA compiler: the host side only
#   no-frontend  install from sources without cuDNN's C++ frontend (no scripts/setup.sh): a status line,
#                and a CUDA consumer built without cuDNN's fused attention
file(REMOVE_RECURSE "${WORK_DIR}")
set(common -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR} -B ${WORK_DIR}/amp-build ${common} -DAMP_BUILD_TESTS=OFF
      -DAMP_BUILD_EXAMPLES=OFF)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/amp-build --prefix ${WORK_DIR}/prefix)
  set(consumers consumer consumer_std)
  if(CUDA)
    list(APPEND consumers consumer_cuda consumer_cuda_std consumer_attention)
  endif()
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DAMP_CONSUMER_OWN_STANDARD=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2 --target ${consumers})
  # Where amp's build found cuDNN's frontend, the installed package finds it for its consumers.
  load_cache(${WORK_DIR}/amp-build READ_WITH_PREFIX amp_ AMP_CUDNN_FRONTEND_DIR)
  set(attention no)
  if(amp_AMP_CUDNN_FRONTEND_DIR)
    set(attention yes)
  endif()
  foreach(c IN LISTS consumers)
    run(${WORK_DIR}/build/${c})
    if(c STREQUAL "consumer_attention" AND NOT last_output MATCHES "cuDNN attention: ${attention}")
      message(FATAL_ERROR "amp's build: cuDNN's frontend at '${amp_AMP_CUDNN_FRONTEND_DIR}'; its consumer: ${last_output}")
    endif()
  endforeach()
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer_cpu -B ${WORK_DIR}/build-cpu -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-cpu -j 2)
  run(${WORK_DIR}/build-cpu/seed)
  set(sets "host" "host data" "core")
  if(CUDA)
    list(APPEND sets "cuda")
  endif()
  if(EXISTS ${WORK_DIR}/prefix/lib/cmake/amp/amp-parallel-targets.cmake)
    list(APPEND sets "host parallel")
  endif()
  foreach(set IN LISTS sets)
    string(REPLACE " " "," want "${set}")  # a comma list: run() would split a ;-list into arguments
    string(REPLACE " " "-" dir "${set}")
    set(arch)
    if(CUDA)
      set(arch -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES})
    endif()
    run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer_components -B ${WORK_DIR}/build-${dir}
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix "-DAMP_WANT=${want}" ${arch})
    run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-${dir} -j 2)
    run(${WORK_DIR}/build-${dir}/components)
    if(NOT last_output MATCHES "consumer OK \\(components: ")
      message(FATAL_ERROR "components '${set}': ${last_output}")
    endif()
  endforeach()
elseif(MODE STREQUAL "subdirectory")
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build ${common}
      -DAMP_CONSUMER_MODE=subdirectory -DAMP_SOURCE_DIR=${AMP_SOURCE_DIR})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2 --target consumer consumer_cuda)
  run(${WORK_DIR}/build/consumer)
  run(${WORK_DIR}/build/consumer_cuda)
elseif(MODE STREQUAL "no-nvcc")
  # What check_language(CUDA) leaves behind on a machine without nvcc.
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR} -B ${WORK_DIR}/amp-build -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_CUDA_COMPILER=NOTFOUND)
  if(NOT last_output MATCHES "no CUDA compiler \\(nvcc\\) found: building the host side only")
    message(FATAL_ERROR "the configure step did not say what it skipped")
  endif()
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/amp-build -j 2 --target seed_linear amp_global_names)
  run(${WORK_DIR}/amp-build/tests/amp_global_names)
  run(${WORK_DIR}/amp-build/examples/seed_linear --device cpu --iterations 30)
  execute_process(COMMAND ${WORK_DIR}/amp-build/examples/seed_linear --device cuda --iterations 1
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "built without its CUDA backend")
    message(FATAL_ERROR "--device cuda in a host-only build: exit ${rc}, '${err}'")
  endif()
elseif(MODE STREQUAL "no-frontend")
  # amp's sources as a clone has them, without .deps/.
  file(COPY ${AMP_SOURCE_DIR}/CMakeLists.txt ${AMP_SOURCE_DIR}/cmake ${AMP_SOURCE_DIR}/include
       DESTINATION ${WORK_DIR}/src)
  run(${CMAKE_COMMAND} -S ${WORK_DIR}/src -B ${WORK_DIR}/amp-build ${common} -DAMP_BUILD_TESTS=OFF
      -DAMP_BUILD_EXAMPLES=OFF)
  if(NOT last_output MATCHES "cuDNN's C\\+\\+ frontend \\(cudnn_frontend.h\\) not found: attention on the GPU")
    message(FATAL_ERROR "the configure step did not say what a missing cuDNN frontend costs (one installed "
                        "outside amp's sources?)")
  endif()
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/amp-build --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2 --target consumer_cuda consumer_attention)
  run(${WORK_DIR}/build/consumer_cuda)
  run(${WORK_DIR}/build/consumer_attention)
  if(NOT last_output MATCHES "cuDNN attention: no")
    message(FATAL_ERROR "a consumer without cuDNN's frontend: ${last_output}")
  endif()
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
message(STATUS "consumer OK (${MODE})")
