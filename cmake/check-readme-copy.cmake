# check-readme-copy.cmake: a README's copy of an expected-output file is
# the file itself.
#
#   cmake -DREADME=<README.md> -DEXPECTED=<file> -P check-readme-copy.cmake
#
# The README holds the copy as one fenced block between two marker lines
# (NAME is the file name of EXPECTED):
#
#   <!-- begin NAME: a copy, refreshed by scripts/update-expected.sh -->
#   ```
#   ...the file, byte for byte...
#   ```
#   <!-- end NAME -->
#
# With NCFSM_UPDATE_EXPECTED=1 in the environment the block is rewritten from
# the file instead (scripts/update-expected.sh).
cmake_minimum_required(VERSION 3.25)
foreach(v README EXPECTED)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check-readme-copy: -D${v}=... is required")
  endif()
endforeach()
get_filename_component(name "${EXPECTED}" NAME)
set(begin "<!-- begin ${name}: a copy, refreshed by scripts/update-expected.sh -->\n")
set(end "<!-- end ${name} -->\n")

file(READ "${README}" text)
file(READ "${EXPECTED}" want)
string(FIND "${text}" "${begin}" b)
string(FIND "${text}" "${end}" e)
if(b EQUAL -1 OR e EQUAL -1 OR e LESS b)
  message(FATAL_ERROR "check-readme-copy: ${README} has no block between the lines\n  ${begin}  ${end}"
                      "(put the copy of ${name} there)")
endif()
string(LENGTH "${begin}" blen)
math(EXPR from "${b} + ${blen}")
math(EXPR len "${e} - ${from}")
string(SUBSTRING "${text}" ${from} ${len} copy)
set(block "```\n${want}```\n")

if("$ENV{NCFSM_UPDATE_EXPECTED}" STREQUAL "1")
  if(NOT copy STREQUAL block)
    string(SUBSTRING "${text}" 0 ${from} head)
    string(SUBSTRING "${text}" ${e} -1 tail)
    file(WRITE "${README}" "${head}${block}${tail}")
    message("check-readme-copy: updated the copy of ${name} in ${README}")
  endif()
  return()
endif()
if(NOT copy STREQUAL block)
  set(actual "${CMAKE_CURRENT_BINARY_DIR}/${name}.readme-copy")
  file(WRITE "${actual}" "${copy}")
  file(WRITE "${actual}.want" "${block}")
  find_program(CHECK_README_DIFF diff)
  if(CHECK_README_DIFF)
    execute_process(COMMAND ${CHECK_README_DIFF} -u "${actual}.want" "${actual}" OUTPUT_VARIABLE d)
    message("${d}")
  endif()
  message(FATAL_ERROR "check-readme-copy: the copy of ${name} in ${README} differs from ${EXPECTED} "
                      "(diff above: - the file, + the README). Run scripts/update-expected.sh <builddir> "
                      "to refresh it.")
endif()
message("check-readme-copy: the copy of ${name} in ${README} is up to date")
