# Builds and runs the consumer projects against amp (cmake -P):
#   install      cmake --install, then find_package: the consumer without and with
#                its own C++20 standard, and the CPU-only consumer (plain g++, host)
#   subdirectory add_subdirectory(amp)
#   no-nvcc      amp's own build with no CUDA compiler: the host side only
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
    list(APPEND consumers consumer_cuda consumer_cuda_std)
  endif()
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DAMP_CONSUMER_OWN_STANDARD=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2 --target ${consumers})
  foreach(c IN LISTS consumers)
    run(${WORK_DIR}/build/${c})
  endforeach()
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer_cpu -B ${WORK_DIR}/build-cpu -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-cpu -j 2)
  run(${WORK_DIR}/build-cpu/seed)
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
  if(rc EQUAL 0 OR NOT err MATCHES "built without nvcc")
    message(FATAL_ERROR "--device cuda in a host-only build: exit ${rc}, '${err}'")
  endif()
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
message(STATUS "consumer OK (${MODE})")
