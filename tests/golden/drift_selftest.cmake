# Proves that `fsm2dot --check` fails on drift. Works on a copy of docs/ in
# WORK; the committed docs are never touched.
#   cmake -DFSM2DOT=<fsm2dot> -DDOCS=<src>/docs -DWORK=<scratch dir> -P drift_selftest.cmake
foreach(v FSM2DOT DOCS WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "drift_selftest: -D${v}=... is required")
  endif()
endforeach()

function(run_check expect_rc expect_text what)
  execute_process(COMMAND ${FSM2DOT} --check ${WORK}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("---- ${what}: exit ${rc}\n${out}${err}")
  if(NOT rc STREQUAL "${expect_rc}")
    message(FATAL_ERROR "drift_selftest: ${what}: fsm2dot --check exited ${rc}, expected ${expect_rc}")
  endif()
  if(NOT "${out}" MATCHES "${expect_text}")
    message(FATAL_ERROR "drift_selftest: ${what}: output does not match '${expect_text}'")
  endif()
endfunction()

function(fresh_copy)
  file(REMOVE_RECURSE ${WORK})
  file(MAKE_DIRECTORY ${WORK})
  file(COPY ${DOCS}/fsm.dot ${DOCS}/fsm-tables.md DESTINATION ${WORK})
endfunction()

# 1. An exact copy passes (so the failures below come from the edits).
fresh_copy()
run_check(0 "match fsm/comm.def" "unmodified copy")

# 2. One legality cell edited by hand in fsm-tables.md: in the matrix,
#    (CLOSED, RELEASE) ALLOW -> DEFER.
fresh_copy()
file(READ ${WORK}/fsm-tables.md md)
string(REGEX MATCH "\n\\| `CLOSED` \\|[^\n]*\\| ALLOW \\|\n" row "${md}")
if(NOT row)
  message(FATAL_ERROR "drift_selftest: the CLOSED row of the legality matrix was not found")
endif()
string(REGEX REPLACE "\\| ALLOW \\|\n$" "| DEFER |\n" row2 "${row}")
string(REPLACE "${row}" "${row2}" md2 "${md}")
file(WRITE ${WORK}/fsm-tables.md "${md2}")
run_check(1 "fsm-tables.md drifted.*\n-\\| `CLOSED` \\|[^\n]*\\| DEFER \\|\n\\+\\| `CLOSED` \\|[^\n]*\\| ALLOW \\|\n.*--target fsm-docs"
  "edited fsm-tables.md")

# 3. A transition label edited in fsm.dot (and tables intact).
fresh_copy()
file(READ ${WORK}/fsm.dot dot)
string(REPLACE "INIT / accept_init (R1)" "INIT / accept_init (R9)" dot2 "${dot}")
if(dot2 STREQUAL dot)
  message(FATAL_ERROR "drift_selftest: the NEW -> INIT_QUEUED edge (INIT / accept_init) was not found in fsm.dot")
endif()
file(WRITE ${WORK}/fsm.dot "${dot2}")
run_check(1 "fsm.dot drifted" "edited fsm.dot")

# 4. A missing file.
fresh_copy()
file(REMOVE ${WORK}/fsm.dot)
run_check(1 "fsm.dot is missing" "missing fsm.dot")

file(REMOVE_RECURSE ${WORK})
message("drift_selftest: fsm2dot --check reports every drift")
