# Runs one fsm2dot built against the small tables of tests/golden/bad (see
# tests/golden/CMakeLists.txt) and checks its verdict.
#   cmake -DEXE=<program> -DWORK=<scratch dir> -DEXPECT_RC=<0|2> -DEXPECT=<text> -P consistency_selftest.cmake
# EXPECT_RC 0: every file is written, fsm-tables.md contains EXPECT, and
#              --check on them passes.
# EXPECT_RC 2: nothing is written, and stderr reports exactly one defect,
#              the one that contains EXPECT (a literal string, not a regex).
foreach(v EXE WORK EXPECT_RC EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "consistency_selftest: -D${v}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/out)
execute_process(COMMAND ${EXE} ${WORK}/out --header ${WORK}/out/states.h
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("---- ${EXE} ${WORK}/out --header ${WORK}/out/states.h: exit ${rc}\n${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "consistency_selftest: exit ${rc}, expected ${EXPECT_RC}")
endif()

if(EXPECT_RC STREQUAL "0")
  foreach(f fsm-comm.dot fsm-comm-happy.dot fsm-toy.dot fsm-tables.md states.h)
    if(NOT EXISTS ${WORK}/out/${f})
      message(FATAL_ERROR "consistency_selftest: ${f} was not written")
    endif()
  endforeach()
  file(READ ${WORK}/out/fsm-tables.md md)
  string(FIND "${md}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "consistency_selftest: fsm-tables.md does not contain '${EXPECT}'")
  endif()
  execute_process(COMMAND ${EXE} --check ${WORK}/out --header ${WORK}/out/states.h
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consistency_selftest: --check of the files just written: exit ${rc}\n${out}${err}")
  endif()
else()
  file(GLOB written ${WORK}/out/*)
  if(written)
    message(FATAL_ERROR "consistency_selftest: files were written from inconsistent tables: ${written}")
  endif()
  string(FIND "${err}" "${EXPECT}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "consistency_selftest: stderr does not contain '${EXPECT}'")
  endif()
  string(REGEX MATCHALL "fsm2dot: defect: " defects "${err}")
  list(LENGTH defects n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "consistency_selftest: ${n} defects reported, expected exactly 1")
  endif()
endif()
file(REMOVE_RECURSE ${WORK})
