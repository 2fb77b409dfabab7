# Proves that `fsm2dot --check` fails on drift. Works on a copy of the
# generated files in WORK; the committed ones are never touched. The edits
# are found in the files (the first edge label, the first ALLOW cell), not
# written for today's tables.
#   cmake -DFSM2DOT=<fsm2dot> -DDOCS=<src>/docs -DHEADER=<src>/include/ncfsm/states.h -DWORK=<scratch dir>
#         -P drift_selftest.cmake
foreach(v FSM2DOT DOCS HEADER WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "drift_selftest: -D${v}=... is required")
  endif()
endforeach()

# expect_rc, then the names of variables (x_*) that hold literal strings
# which stdout must contain, in order (names, not values: a line of a .dot
# file may hold ';').
function(run_check what expect_rc)
  execute_process(COMMAND ${FSM2DOT} --check ${WORK}/docs --header ${WORK}/states.h
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("---- ${what}: exit ${rc}\n${out}${err}")
  if(NOT rc STREQUAL "${expect_rc}")
    message(FATAL_ERROR "drift_selftest: ${what}: fsm2dot --check exited ${rc}, expected ${expect_rc}")
  endif()
  set(rest "${out}")
  foreach(name IN LISTS ARGN)
    string(FIND "${rest}" "${${name}}" pos)
    if(pos EQUAL -1)
      message(FATAL_ERROR "drift_selftest: ${what}: the output does not contain (after the previous text) '${${name}}'")
    endif()
    string(SUBSTRING "${rest}" ${pos} -1 rest)
  endforeach()
endfunction()

function(fresh_copy)
  file(REMOVE_RECURSE ${WORK})
  file(MAKE_DIRECTORY ${WORK}/docs)
  file(GLOB dots ${DOCS}/fsm-*.dot)
  file(COPY ${dots} ${DOCS}/fsm-tables.md DESTINATION ${WORK}/docs)
  file(COPY ${HEADER} DESTINATION ${WORK})
endfunction()

# The first line of `file` that begins with a match of `regex` (within the
# line), in `var`.
function(first_line file regex var)
  file(READ ${file} text)
  string(REGEX MATCH "\n${regex}[^\n]*" line "\n${text}")
  if(NOT line)
    message(FATAL_ERROR "drift_selftest: no line of ${file} matches '${regex}'")
  endif()
  string(SUBSTRING "${line}" 1 -1 line)
  set(${var} "${line}" PARENT_SCOPE)
endfunction()

# Replaces the first occurrence of `from` in line `line` of `file` by `to`;
# the edited line in `var`.
function(edit_line file line from to var)
  file(READ ${file} text)
  string(FIND "${line}" "${from}" at)
  string(SUBSTRING "${line}" 0 ${at} head)
  string(LENGTH "${from}" n)
  math(EXPR tail_at "${at} + ${n}")
  string(SUBSTRING "${line}" ${tail_at} -1 tail)
  set(edited "${head}${to}${tail}")
  string(REPLACE "${line}\n" "${edited}\n" text2 "${text}")
  file(WRITE ${file} "${text2}")
  set(${var} "${edited}" PARENT_SCOPE)
endfunction()

set(x_ok1 "files match the tables")
set(x_ok2 "states.h matches the tables")
set(x_regen1 "Regenerate them with")
set(x_regen2 "--target fsm-docs")

# 1. An exact copy passes (so the failures below come from the edits).
fresh_copy()
run_check("unmodified copy" 0 x_ok1 x_ok2)

# One line of a fresh copy edited by hand: the first line of WORK/`name`
# that begins with a match of `regex`, its first `from` replaced by `to`.
# --check must show the line as diff -u does and name the file.
function(check_edit name regex from to)
  fresh_copy()
  first_line(${WORK}/${name} "${regex}" line)
  edit_line(${WORK}/${name} "${line}" "${from}" "${to}" edited)
  set(x_diff "\n-${edited}\n+${line}\n")
  get_filename_component(base ${name} NAME)
  set(x_what "${base} drifted")
  run_check("edited ${name}" 1 x_diff x_what x_regen1 x_regen2)
endfunction()

# 2. One legality cell of fsm-tables.md: the first ALLOW cell of the matrix
#    (the first line with one) becomes DEFER.
check_edit(docs/fsm-tables.md "[^\n]*\\| ALLOW \\|" "| ALLOW |" "| DEFER |")
# 3. An edge label of fsm-comm.dot (the tables intact).
check_edit(docs/fsm-comm.dot "  [A-Z_]+ -> [A-Z_]+ [^\n]*label=<" "label=<" "label=<x")
# 4. The header: the first flag's value.
check_edit(states.h "#define NCFSM_SF_" " 0x" " 0x1")

# 5. A missing file.
fresh_copy()
file(REMOVE ${WORK}/docs/fsm-comm-happy.dot)
set(x_what "fsm-comm-happy.dot is missing")
run_check("missing fsm-comm-happy.dot" 1 x_what x_regen1 x_regen2)

# 6. A diagram that no machine makes (a machine removed or renamed).
fresh_copy()
file(WRITE ${WORK}/docs/fsm-gone.svg "<svg/>\n")
set(x_what "fsm-gone.svg is made by no machine of the tables: remove it")
run_check("stale fsm-gone.svg" 1 x_what x_regen1 x_regen2)

file(REMOVE_RECURSE ${WORK})
message("drift_selftest: fsm2dot --check reports every drift")
