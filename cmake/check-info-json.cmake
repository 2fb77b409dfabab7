# check-info-json.cmake: `ncfsm-info --json` is one valid JSON object with
# the documented keys, and it agrees with the text report.
#
#   cmake -DINFO=<ncfsm-info> -DVERSION=<x.y.z> -DSETTINGS=A,B,... [-DBACKEND=sim]
#         [-DNO_GPU=ON] -P check-info-json.cmake
#
# SETTINGS: the NCFSM_* settings the report must list, in order (comma
# separated). BACKEND: what NCFSM_BACKEND as set must resolve to
# (backend.configured). NO_GPU=ON: the run hides every GPU
# (CUDA_VISIBLE_DEVICES= in the test's environment), so gpus is empty,
# gpus_error says why and auto picks sim.
cmake_minimum_required(VERSION 3.25)
foreach(v INFO VERSION SETTINGS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check-info-json: -D${v}=... is required")
  endif()
endforeach()
string(REPLACE "," ";" settings "${SETTINGS}")

execute_process(COMMAND ${INFO} --json RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
execute_process(COMMAND ${INFO} RESULT_VARIABLE text_rc OUTPUT_VARIABLE text ERROR_VARIABLE text_err)

set(failures "")
function(fail text)
  set(failures "${failures}  - ${text}\n" PARENT_SCOPE)
endfunction()

# Fails unless the member at the path (JSON keys) has type want
# (OBJECT ARRAY STRING NUMBER BOOLEAN NULL; "STRING|NULL" allows either).
function(expect_type want)
  string(JSON t ERROR_VARIABLE e TYPE "${json}" ${ARGN})
  string(REPLACE ";" "." path "${ARGN}")
  if(e)
    set(failures "${failures}  - ${path}: ${e}\n" PARENT_SCOPE)
  elseif(NOT t MATCHES "^(${want})$")
    set(failures "${failures}  - ${path} is ${t}, expected ${want}\n" PARENT_SCOPE)
  endif()
endfunction()
# Fails unless the member at the path is a string equal to want.
function(expect_value want)
  string(JSON v ERROR_VARIABLE e GET "${json}" ${ARGN})
  string(REPLACE ";" "." path "${ARGN}")
  if(e)
    set(failures "${failures}  - ${path}: ${e}\n" PARENT_SCOPE)
  elseif(NOT v STREQUAL want)
    set(failures "${failures}  - ${path} is '${v}', expected '${want}'\n" PARENT_SCOPE)
  endif()
endfunction()

if(NOT rc EQUAL 0)
  fail("ncfsm-info --json exited ${rc}, expected 0")
endif()
if(NOT text_rc EQUAL 0)
  fail("ncfsm-info exited ${text_rc}, expected 0")
endif()
string(JSON root_type ERROR_VARIABLE parse_error TYPE "${json}")
if(parse_error OR NOT root_type STREQUAL "OBJECT")
  fail("the output is not one JSON object: ${parse_error}")
else()
  expect_value("${VERSION}" ncfsm_version)
  expect_type(OBJECT build)
  expect_type(BOOLEAN build nccl_backend)
  expect_type(OBJECT nccl)
  expect_type(BOOLEAN nccl loaded)
  foreach(ep ncclCommRevoke ncclCommShrink ncclAlltoAll ncclGather ncclScatter)
    expect_type("BOOLEAN|NULL" nccl optional ${ep} present)
    expect_type(STRING nccl optional ${ep} since)
  endforeach()
  expect_type(OBJECT cuda)
  expect_type(BOOLEAN cuda loaded)
  expect_type(ARRAY gpus)
  expect_type("STRING|NULL" gpus_error)
  expect_type(STRING backend auto)
  expect_type(STRING backend auto_reason)
  if(DEFINED BACKEND)
    expect_value("${BACKEND}" backend configured)
  endif()
  if(NO_GPU)
    string(JSON ngpus ERROR_VARIABLE e LENGTH "${json}" gpus)
    if(NOT ngpus STREQUAL "0")
      fail("gpus has ${ngpus} entries although every GPU is hidden")
    endif()
    expect_type(STRING gpus_error)
    expect_value(sim backend auto)
  endif()

  # config: exactly the settings listed, each with its effective value (a
  # string) and its environment value (a string or null); the text report
  # shows the same value on the setting's line, and lists them in order.
  list(LENGTH settings want_n)
  string(JSON n ERROR_VARIABLE e LENGTH "${json}" config)
  if(e)
    fail("config: ${e}")
  else()
    if(NOT n EQUAL want_n)
      fail("config has ${n} settings, expected ${want_n} (${SETTINGS})")
    endif()
    # (CMake's JSON parser sorts members: the order is checked on the text.)
    set(in_order "")
    foreach(name IN LISTS settings)
      string(APPEND in_order "\n  ${name} [^\n]*")
      expect_type(STRING config ${name} value)
      expect_type("STRING|NULL" config ${name} env)
      string(JSON value ERROR_VARIABLE e GET "${json}" config ${name} value)
      if(NOT e)
        string(REGEX REPLACE "([][()+*.?^$|\\])" "\\\\\\1" value_re "${value}")
        if(NOT text MATCHES "\n  ${name} +${value_re} +(default|set: )")
          fail("the text report has no line '  ${name}  ${value}  default|set: ...' (the value in --json)")
        endif()
      endif()
    endforeach()
    if(NOT text MATCHES "${in_order}\n")
      fail("the text report does not list the settings in this order, one a line: ${SETTINGS}")
    endif()
  endif()
endif()

if(NOT failures STREQUAL "")
  message("---- ncfsm-info --json (exit ${rc})\n${json}\n---- stderr\n${err}\n"
          "---- ncfsm-info (exit ${text_rc})\n${text}\n---- stderr\n${text_err}\n----")
  message(FATAL_ERROR "check-info-json:\n${failures}")
endif()
list(LENGTH settings n)
message("check-info-json: ncfsm-info --json is valid, has every key and its ${n} settings match the text report")
