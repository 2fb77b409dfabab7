# check-output.cmake: run a command and check its exit status and output.
# Used by the CTests of tools/ and examples/.
#
#   cmake [-DNAME=VALUE ...] -P check-output.cmake -- COMMAND [ARG ...]
#
# Everything after `--` is the command (run without a shell). Checks, all
# optional; every failed check is reported, then the script fails:
#
#   EXPECT_RC=N          exit status (default 0)
#   APPEND_FILE=PATH     after the run, PATH's content is appended to stdout
#                        (a file the command wrote), so the checks see it
#   FILTER<i>=REGEX      (i = 1, 2, ...) replaced in stdout by REPLACE<i>
#   REPLACE<i>=TEXT      (default empty) before every check below: timings,
#                        addresses, ports
#   EXPECTED=FILE        the filtered stdout must equal FILE byte for byte;
#                        on a mismatch a unified diff (expected -> actual)
#                        is printed and the filtered stdout is kept in
#                        ACTUAL (default <cwd>/<name of FILE>.actual)
#   MATCH<i>=REGEX       stdout must contain a match of REGEX
#   NOMATCH<i>=REGEX     stdout must not contain a match of REGEX
#   LINES<i>=N=REGEX     exactly N lines of stdout begin with a match of
#                        REGEX (that ends at the line's end when REGEX ends
#                        with `$`)
#   STDERR_MATCH<i>=REGEX, STDERR_NOMATCH<i>=REGEX   the same on stderr
#   STDERR_EMPTY=ON      stderr must be empty
#   FRESH_DIR=DIR        DIR is removed and created empty before the run
#   FILE<i>=PATH         after the run PATH must exist and be non-empty
#
# CMake regular expressions: `^` and `$` anchor the whole text, not a line;
# use LINES for line-anchored counts. A `;` cannot be passed in a value
# through add_test (it separates list items): match it with `.`.
#
# Update mode: with NCFSM_UPDATE_EXPECTED=1 in the environment the filtered
# stdout is written to EXPECTED instead of being compared, once every other
# check passed (scripts/update-expected.sh).

cmake_minimum_required(VERSION 3.25)

set(argv)
set(seen_sep FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 0 ${last})
  if(seen_sep)
    list(APPEND argv "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(seen_sep TRUE)
  endif()
endforeach()
if(NOT argv)
  message(FATAL_ERROR "check-output: no command: pass it after `--`")
endif()
if(NOT DEFINED EXPECT_RC)
  set(EXPECT_RC 0)
endif()
string(REPLACE ";" " " argv_text "${argv}")

if(DEFINED FRESH_DIR)
  file(REMOVE_RECURSE "${FRESH_DIR}")
  file(MAKE_DIRECTORY "${FRESH_DIR}")
endif()

if(DEFINED APPEND_FILE)
  file(REMOVE "${APPEND_FILE}")
endif()

execute_process(COMMAND ${argv} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)

set(failures "")
function(fail text) # a function: a macro would turn a \n in text into a newline
  set(failures "${failures}  - ${text}\n" PARENT_SCOPE)
endfunction()

if(DEFINED APPEND_FILE)
  if(EXISTS "${APPEND_FILE}")
    file(READ "${APPEND_FILE}" appended)
    string(APPEND out "${appended}")
  else()
    fail("APPEND_FILE ${APPEND_FILE} was not written")
  endif()
endif()

if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  fail("exit status ${rc}, expected ${EXPECT_RC}")
endif()

foreach(i RANGE 1 50)
  if(DEFINED FILTER${i})
    string(REGEX REPLACE "${FILTER${i}}" "${REPLACE${i}}" out "${out}")
  endif()
endforeach()

# A regular expression as shown in a message: its newlines as \n.
function(shown var out)
  string(REPLACE "\n" "\\n" t "${${var}}")
  set(${out} "${t}" PARENT_SCOPE)
endfunction()

foreach(i RANGE 1 50)
  foreach(v MATCH NOMATCH STDERR_MATCH STDERR_NOMATCH)
    shown(${v}${i} ${v}_shown)
  endforeach()
  if(DEFINED MATCH${i} AND NOT "${out}" MATCHES "${MATCH${i}}")
    fail("stdout has no match of MATCH${i} '${MATCH_shown}'")
  endif()
  if(DEFINED NOMATCH${i} AND "${out}" MATCHES "${NOMATCH${i}}")
    fail("stdout matches NOMATCH${i} '${NOMATCH_shown}': '${CMAKE_MATCH_0}'")
  endif()
  if(DEFINED STDERR_MATCH${i} AND NOT "${err}" MATCHES "${STDERR_MATCH${i}}")
    fail("stderr has no match of STDERR_MATCH${i} '${STDERR_MATCH_shown}'")
  endif()
  if(DEFINED STDERR_NOMATCH${i} AND "${err}" MATCHES "${STDERR_NOMATCH${i}}")
    fail("stderr matches STDERR_NOMATCH${i} '${STDERR_NOMATCH_shown}': '${CMAKE_MATCH_0}'")
  endif()
  if(DEFINED LINES${i})
    if(NOT "${LINES${i}}" MATCHES "^([0-9]+)=(.+)$")
      message(FATAL_ERROR "check-output: LINES${i} must be N=REGEX, got '${LINES${i}}'")
    endif()
    set(want "${CMAKE_MATCH_1}")
    set(re "${CMAKE_MATCH_2}")
    set(rest "[^\n]*")
    if(re MATCHES "^(.*)[$]$")
      set(re "${CMAKE_MATCH_1}")
      set(rest "")
    endif()
    # Each line that matches becomes one marker; count those (a list of the
    # lines themselves would split at `;` and merge at `[`). The newlines are
    # doubled so that a match may consume the one after its line and still
    # leave one before the next line.
    string(REPLACE "\n" "\n\n" doubled "\n${out}")
    string(REGEX REPLACE "\n(${re})${rest}\n" "\n@LINE@\n" marked "${doubled}\n")
    string(REGEX MATCHALL "\n@LINE@\n" hits "${marked}")
    list(LENGTH hits n)
    if(NOT n EQUAL want)
      shown(re re_shown)
    fail("${n} lines of stdout begin with a match of LINES${i} '${re_shown}', expected ${want}")
    endif()
  endif()
  if(DEFINED FILE${i})
    if(NOT EXISTS "${FILE${i}}")
      fail("FILE${i} ${FILE${i}} was not produced")
    else()
      file(SIZE "${FILE${i}}" size)
      if(size EQUAL 0)
        fail("FILE${i} ${FILE${i}} is empty")
      endif()
    endif()
  endif()
endforeach()
if(STDERR_EMPTY AND NOT "${err}" STREQUAL "")
  fail("stderr is not empty")
endif()

# Prints a unified diff of two files (diff -u when it exists, else one hunk
# from the first to the last differing line, made here).
function(print_diff a b)
  if(NOT CHECK_OUTPUT_NO_DIFF_TOOL)
    find_program(CHECK_OUTPUT_DIFF diff)
  endif()
  if(CHECK_OUTPUT_DIFF)
    execute_process(COMMAND ${CHECK_OUTPUT_DIFF} -u "${a}" "${b}" OUTPUT_VARIABLE d ERROR_VARIABLE d)
    message("${d}")
    return()
  endif()
  # Lines in numbered variables, not a list: a CMake list would split or
  # merge lines at `;`, `[` and `]`.
  foreach(f a b)
    file(READ "${${f}}" t)
    set(n 0)
    while(NOT t STREQUAL "")
      string(FIND "${t}" "\n" nl)
      if(nl EQUAL -1)
        set(${f}_${n} "${t}")
        set(t "")
      else()
        string(SUBSTRING "${t}" 0 ${nl} ${f}_${n})
        math(EXPR nl "${nl} + 1")
        string(SUBSTRING "${t}" ${nl} -1 t)
      endif()
      math(EXPR n "${n} + 1")
    endwhile()
    set(${f}_n ${n})
  endforeach()
  set(first 0)
  while(first LESS a_n AND first LESS b_n)
    if(NOT "${a_${first}}" STREQUAL "${b_${first}}")
      break()
    endif()
    math(EXPR first "${first} + 1")
  endwhile()
  set(ta ${a_n})
  set(tb ${b_n})
  while(ta GREATER first AND tb GREATER first)
    math(EXPR ia "${ta} - 1")
    math(EXPR ib "${tb} - 1")
    if(NOT "${a_${ia}}" STREQUAL "${b_${ib}}")
      break()
    endif()
    set(ta ${ia})
    set(tb ${ib})
  endwhile()
  math(EXPR line "${first} + 1")
  set(h "--- ${a}\n+++ ${b}\n@@ first difference at line ${line} @@\n")
  set(i ${first})
  foreach(k 1 2 3)
    if(i GREATER 0)
      math(EXPR i "${i} - 1")
    endif()
  endforeach()
  while(i LESS first)
    string(APPEND h " ${a_${i}}\n")
    math(EXPR i "${i} + 1")
  endwhile()
  foreach(f a b)
    if(f STREQUAL "a")
      set(mark "-")
      set(to ${ta})
    else()
      set(mark "+")
      set(to ${tb})
    endif()
    set(i ${first})
    while(i LESS to)
      string(APPEND h "${mark}${${f}_${i}}\n")
      math(EXPR i "${i} + 1")
    endwhile()
  endforeach()
  set(i ${ta})
  math(EXPR stop "${ta} + 3")
  while(i LESS a_n AND i LESS stop)
    string(APPEND h " ${a_${i}}\n")
    math(EXPR i "${i} + 1")
  endwhile()
  message("${h}")
endfunction()

if(DEFINED EXPECTED)
  get_filename_component(expected_name "${EXPECTED}" NAME)
  if(NOT DEFINED ACTUAL)
    set(ACTUAL "${CMAKE_CURRENT_BINARY_DIR}/${expected_name}.actual")
  endif()
  if("$ENV{NCFSM_UPDATE_EXPECTED}" STREQUAL "1")
    if(failures STREQUAL "")
      file(WRITE "${EXPECTED}" "${out}")
      message("check-output: updated ${EXPECTED}")
    endif()
  elseif(NOT EXISTS "${EXPECTED}")
    fail("the expected output ${EXPECTED} does not exist (scripts/update-expected.sh creates it)")
  else()
    file(READ "${EXPECTED}" want)
    if(NOT "${out}" STREQUAL "${want}")
      file(WRITE "${ACTUAL}" "${out}")
      message("check-output: the output (filtered) differs from ${EXPECTED}:")
      print_diff("${EXPECTED}" "${ACTUAL}")
      fail("the output (filtered) differs from ${expected_name}: the actual output is in ${ACTUAL}\n    if the change is intended, run scripts/update-expected.sh <builddir> and commit ${EXPECTED}")
    endif()
  endif()
endif()

if(NOT failures STREQUAL "")
  message("check-output: ${argv_text}\n---- exit status ${rc}\n---- stdout (filtered)\n${out}---- stderr\n${err}----")
  message(FATAL_ERROR "check-output: ${argv_text}:\n${failures}")
endif()
message("check-output: ${argv_text}: ok")
