# Runs one fsm2dot built against tests/golden/bad/fsm/comm.def (see
# tests/golden/CMakeLists.txt) and checks its verdict.
#   cmake -DEXE=<program> -DWORK=<scratch dir> -DEXPECT_RC=<0|2> -DEXPECT=<text> -P consistency_selftest.cmake
# EXPECT_RC 0: both files are written and fsm-tables.md contains EXPECT.
# EXPECT_RC 2: nothing is written, and the output reports exactly one defect,
#              the one that contains EXPECT (a literal string, not a regex).
foreach(v EXE WORK EXPECT_RC EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consistency_selftest: -D${v}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${EXE} ${WORK}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("---- ${EXE} ${WORK}: exit ${rc}\n${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "consistency_selftest: exit ${rc}, expected ${EXPECT_RC}")
endif()

if(EXPECT_RC STREQUAL "0")
  foreach(f fsm.dot fsm-tables.md)
    if(NOT EXISTS ${WORK}/${f})
      message(FATAL_ERROR "consistency_selftest: ${f} was not written")
    endif()
  endforeach()
  file(READ ${WORK}/fsm-tables.md md)
  string(FIND "${md}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "consistency_selftest: fsm-tables.md does not contain '${EXPECT}'")
  endif()
else()
  foreach(f fsm.dot fsm-tables.md)
    if(EXISTS ${WORK}/${f})
      message(FATAL_ERROR "consistency_selftest: ${f} was written from an inconsistent table")
    endif()
  endforeach()
  string(FIND "${err}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "consistency_selftest: stderr does not contain '${EXPECT}'")
  endif()
  string(REGEX MATCHALL "fsm2dot: fsm/comm.def: " defects "${err}")
  list(LENGTH defects n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "consistency_selftest: ${n} defects reported, expected exactly 1")
  endif()
endif()
file(REMOVE_RECURSE ${WORK})
