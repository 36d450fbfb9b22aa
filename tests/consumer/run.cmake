# Builds tests/consumer against amp in MODE "install" (cmake --install, then
# find_package) or "subdirectory" (add_subdirectory), and runs it.
file(REMOVE_RECURSE "${WORK_DIR}")
set(common -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} -DCMAKE_BUILD_TYPE=Release)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR} -B ${WORK_DIR}/amp-build ${common} -DAMP_BUILD_TESTS=OFF
      -DAMP_BUILD_EXAMPLES=OFF)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/amp-build --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  run(${CMAKE_COMMAND} -S ${AMP_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build ${common}
      -DAMP_CONSUMER_MODE=subdirectory -DAMP_SOURCE_DIR=${AMP_SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run(${WORK_DIR}/build/consumer)
message(STATUS "${last_output}")
run(${WORK_DIR}/build/consumer_cuda)
