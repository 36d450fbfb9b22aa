# The snippet test: build the snippets' target (which reconfigures first when a
# Markdown file changed), then run each program of the manifest that build wrote;
# print what was not compiled.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target amp_readme_snippets --parallel 2
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a documentation snippet does not compile (the messages above name its file and line)")
endif()
file(STRINGS ${MANIFEST} manifest)
foreach(entry IN LISTS manifest)
  if(entry MATCHES "^stale ([^ ]+) (.*)")
    message(FATAL_ERROR "${CMAKE_MATCH_1}: the block differs from ${CMAKE_MATCH_2}: paste the file again")
  elseif(entry MATCHES "^skip (.*)")
    message("not compiled: ${CMAKE_MATCH_1}")
  elseif(entry MATCHES "^parallel (.*)" AND NOT MPI)
    message("not compiled (no MPI): ${CMAKE_MATCH_1}")
  elseif(entry MATCHES "^program (.*)")
    execute_process(COMMAND ${BIN_DIR}/readme_${CMAKE_MATCH_1} RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${CMAKE_MATCH_1} exited with ${rc}")
    endif()
  endif()
endforeach()
