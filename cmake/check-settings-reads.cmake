# check-settings-reads.cmake: every environment variable the source tree
# reads has a row in core/settings.def, and every row that no option struct
# reads is read somewhere.
#
#   cmake -DROOT=<source dir> [-DEXTRA=<file>] -P check-settings-reads.cmake
#
# Reads found: in C (*.c, *.h) a string literal "NCFSM_..." passed to getenv,
# secure_getenv, ncfsm__env_* or a local env_* helper; in Python
# os.environ[...] / os.environ.get / os.getenv; in shell ${NCFSM_...:-...}
# (a read of the caller's environment, not of a script's own variable); in
# CMake $ENV{NCFSM_...}. The rows read by the table itself (a field of
# ncfsm_comm_opts, ncfsm_loop_opts, ncfsm_sim_opts or ncfsm_boot_opts) need no
# other reader; any other row must be read by one of those patterns or by its
# id NCFSM__SET_<key>. The library's own code (core/, fsm/) reads every
# variable through the table (core/settings.h: an option field, or
# ncfsm__setting_env / ncfsm__setting_get by id): a getenv or ncfsm__env_* of
# a variable of the table there fails the check too. EXTRA: one more file
# scanned as C (the self-test plants an unknown read there).
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED ROOT)
  message(FATAL_ERROR "check-settings-reads: -DROOT=<source dir> is required")
endif()

file(STRINGS ${ROOT}/core/settings.def rows REGEX "^NCFSM_SETTING\\([A-Z0-9_]+, (ENV|RAW|OPT),")
set(known)
set(need_reader)
foreach(row IN LISTS rows)
  string(REGEX MATCH "^NCFSM_SETTING\\(([A-Z0-9_]+), (ENV|RAW|OPT)," m "${row}")
  set(key ${CMAKE_MATCH_1})
  set(src ${CMAKE_MATCH_2})
  if(src STREQUAL "OPT")
    continue()
  endif()
  if(src STREQUAL "ENV")
    set(name NCFSM_${key})
  else()
    set(name ${key})
  endif()
  list(APPEND known ${name})
  # The row's field column: read by the table's fill of that struct.
  if(NOT row MATCHES "NCFSM_FIELD\\(")
    list(APPEND need_reader "${name}=${key}")
  endif()
endforeach()
list(LENGTH known n_known)
if(n_known LESS 10)
  message(FATAL_ERROR "check-settings-reads: only ${n_known} rows read from core/settings.def")
endif()

set(dirs fsm core bootstrap testkit examples tools bench tests http scripts cmake)
set(c_files)
set(py_files)
set(sh_files)
set(cmake_files)
foreach(d IN LISTS dirs)
  file(GLOB_RECURSE f LIST_DIRECTORIES false ${ROOT}/${d}/*.c ${ROOT}/${d}/*.h)
  list(APPEND c_files ${f})
  file(GLOB_RECURSE f LIST_DIRECTORIES false ${ROOT}/${d}/*.py)
  list(APPEND py_files ${f})
  file(GLOB_RECURSE f LIST_DIRECTORIES false ${ROOT}/${d}/*.sh)
  list(APPEND sh_files ${f})
  file(GLOB_RECURSE f LIST_DIRECTORIES false ${ROOT}/${d}/*.cmake ${ROOT}/${d}/CMakeLists.txt)
  list(APPEND cmake_files ${f})
endforeach()
list(APPEND cmake_files ${ROOT}/CMakeLists.txt)
list(APPEND sh_files ${ROOT}/Makefile)
if(DEFINED EXTRA)
  list(APPEND c_files ${EXTRA})
endif()

set(found)     # NAME@file
set(lax "")    # reads in the library that bypass the table
set(all_text "")
function(scan files regex)
  foreach(path IN LISTS files)
    file(READ ${path} text)
    string(REGEX MATCHALL "${regex}" hits "${text}")
    file(RELATIVE_PATH rel ${ROOT} ${path})
    foreach(h IN LISTS hits)
      string(REGEX MATCH "(NCFSM_[A-Z0-9_]+|PMIX_RANK|NCCL_DEBUG)" name "${h}")
      list(APPEND found "${name}@${rel}")
    endforeach()
    set(all_text "${all_text}\n${text}")
  endforeach()
  set(found ${found} PARENT_SCOPE)
  set(all_text "${all_text}" PARENT_SCOPE)
endfunction()

scan("${c_files}" "(getenv|secure_getenv|ncfsm__env_[a-z_]+|env_[a-z0-9_]+)[ \t\n]*\\([ \t\n]*\"(NCFSM_[A-Z0-9_]+|PMIX_RANK|NCCL_DEBUG)\"")
scan("${py_files}" "(environ\\.get\\(|environ\\[|getenv\\()[ \t]*[\"'](NCFSM_[A-Z0-9_]+)[\"']")
scan("${sh_files}" "\\$\\{NCFSM_[A-Z0-9_]+:?[-=]")
scan("${cmake_files}" "\\$ENV\\{NCFSM_[A-Z0-9_]+\\}")

# The library: no read around the table.
foreach(path IN LISTS c_files)
  file(RELATIVE_PATH rel ${ROOT} ${path})
  if(NOT rel MATCHES "^(core|fsm)/")
    continue()
  endif()
  file(READ ${path} text)
  string(REGEX MATCHALL "(getenv|secure_getenv|ncfsm__env_[a-z_]+)[ \t\n]*\\([ \t\n]*\"(NCFSM_[A-Z0-9_]+|PMIX_RANK|NCCL_DEBUG)\"" hits "${text}")
  foreach(h IN LISTS hits)
    string(REGEX MATCH "\"([A-Z0-9_]+)\"" m "${h}")
    string(APPEND lax "  ${CMAKE_MATCH_1} (${rel})\n")
  endforeach()
endforeach()

set(unknown "")
set(read_names)
foreach(hit IN LISTS found)
  string(REPLACE "@" ";" parts "${hit}")
  list(GET parts 0 name)
  list(GET parts 1 where)
  list(APPEND read_names ${name})
  list(FIND known ${name} i)
  if(i LESS 0)
    string(APPEND unknown "  ${name} (read in ${where})\n")
  endif()
endforeach()

set(unread "")
foreach(pair IN LISTS need_reader)
  string(REPLACE "=" ";" parts "${pair}")
  list(GET parts 0 name)
  list(GET parts 1 key)
  list(FIND read_names ${name} i)
  if(i LESS 0 AND NOT all_text MATCHES "NCFSM__SET_${key}[^A-Z0-9_]")
    string(APPEND unread "  ${name}\n")
  endif()
endforeach()

if(NOT unknown STREQUAL "" OR NOT unread STREQUAL "" OR NOT lax STREQUAL "")
  set(msg "")
  if(NOT unknown STREQUAL "")
    string(APPEND msg "variables read that have no row in core/settings.def (add one: its type, default, "
                      "accepted values, field and effect; docs/settings.md follows from it):\n${unknown}")
  endif()
  if(NOT unread STREQUAL "")
    string(APPEND msg "rows of core/settings.def that nothing reads (remove them, or read them through the "
                      "table):\n${unread}")
  endif()
  if(NOT lax STREQUAL "")
    string(APPEND msg "reads in the library (core/, fsm/) around the table (read them through core/settings.h: "
                      "an option field, or ncfsm__setting_env(NCFSM__SET_<key>); the call that leads there refuses a "
                      "malformed value, as ncfsm_comm_new does):\n${lax}")
  endif()
  message(FATAL_ERROR "check-settings-reads: ${msg}")
endif()
list(REMOVE_DUPLICATES read_names)
list(LENGTH read_names n_read)
list(LENGTH found n_found)
message("check-settings-reads: ${n_found} reads of ${n_read} variables, all in core/settings.def (${n_known} variables)")
