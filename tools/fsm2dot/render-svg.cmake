# Renders every DOCS/fsm-*.dot to DOCS/fsm-*.svg with graphviz (target
# fsm-docs, after fsm2dot wrote the .dot files).
#   cmake -DDOT=<dot program or empty> -DDOCS=<docs dir> -P render-svg.cmake
if(NOT DOT)
  message(WARNING "fsm-docs: graphviz dot was not found at configure time: docs/fsm-*.svg were not rendered "
    "(install graphviz, then reconfigure)")
  return()
endif()
file(GLOB dots ${DOCS}/fsm-*.dot)
list(SORT dots)
foreach(d IN LISTS dots)
  string(REGEX REPLACE "\\.dot$" ".svg" svg "${d}")
  execute_process(COMMAND ${DOT} -Tsvg ${d} -o ${svg} RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fsm-docs: ${DOT} -Tsvg ${d} failed (${rc}): ${err}")
  endif()
  message(STATUS "fsm-docs: ${svg}")
endforeach()
