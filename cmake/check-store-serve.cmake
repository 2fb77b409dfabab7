# check-store-serve.cmake: ncfsm-store serves a job and stops cleanly.
#
#   cmake -DSTORE=<ncfsm-store> -DCLIENT=<02_group_semantics> -DWORK=<scratch dir>
#         -P check-store-serve.cmake
#
# The launch of docs/bootstrap.md "run the store on its own", on the sim:
#   1. ncfsm-store --listen 127.0.0.1:0 --print-port (a free port; the token
#      from NCFSM_STORE_TOKEN), in the background;
#   2. two processes of CLIENT, NCFSM_RANK=0 and 1, NCFSM_WORLD_SIZE=2, that
#      find each other through the store (tcp bootstrap) and run their
#      checks on the multi-process sim: both exit 0, rank 0 reports 18/18 PASS;
#   3. one process with a wrong token: refused by the store, exits non-zero
#      and says why;
#   4. SIGTERM: the store exits 0 and its counters say 3 connections,
#      2 authenticated, 1 bad token, 0 bad frames.
# A POSIX shell runs the processes (CMake cannot start one in the
# background); the checks are made here.
cmake_minimum_required(VERSION 3.25)
foreach(v STORE CLIENT WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check-store-serve: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

set(script [=[
store=$1 client=$2 work=$3
export NCFSM_STORE_TOKEN="ncfsm-ctest-$$" NCFSM_BACKEND=sim
unset NCFSM_STORE_ADDR NCFSM_STORE_HOST NCFSM_BOOTSTRAP PMIX_RANK
"$store" --listen 127.0.0.1:0 --print-port >"$work/port" 2>"$work/store.err" &
spid=$!
trap 'kill -TERM $spid 2>/dev/null' EXIT HUP INT TERM
i=0
until grep -q '^[0-9][0-9]*$' "$work/port" 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 400 ] || ! kill -0 $spid 2>/dev/null; then
    echo "ncfsm-store did not print its port within 20 s (or exited)" >"$work/setup.err"
    exit 1
  fi
  sleep 0.05
done
port=$(cat "$work/port")
export NCFSM_STORE_ADDR=127.0.0.1:$port NCFSM_WORLD_SIZE=2
NCFSM_RANK=1 timeout 120 "$client" --count 4096 >"$work/rank1.out" 2>&1 &
c1=$!
NCFSM_RANK=0 timeout 120 "$client" --count 4096 >"$work/rank0.out" 2>&1
echo $? >"$work/rank0.rc"
wait $c1
echo $? >"$work/rank1.rc"
NCFSM_STORE_TOKEN=not-the-job-token NCFSM_RANK=0 NCFSM_WORLD_SIZE=1 \
  timeout 120 "$client" --count 4096 >"$work/badtoken.out" 2>&1
echo $? >"$work/badtoken.rc"
trap - EXIT HUP INT TERM
kill -TERM $spid
wait $spid
echo $? >"$work/store.rc"
]=])

execute_process(COMMAND sh -c "${script}" sh "${STORE}" "${CLIENT}" "${WORK}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)

set(failures "")
function(read_file name var)
  if(EXISTS "${WORK}/${name}")
    file(READ "${WORK}/${name}" t)
    string(STRIP "${t}" t)
  else()
    set(t "(${name} missing)")
  endif()
  set(${var} "${t}" PARENT_SCOPE)
endfunction()
function(fail text)
  set(failures "${failures}  - ${text}\n" PARENT_SCOPE)
endfunction()

if(NOT rc EQUAL 0)
  read_file(setup.err setup)
  fail("the driver script failed (${rc}): ${setup} ${out}")
endif()
read_file(store.rc store_rc)
read_file(store.err store_err)
read_file(rank0.rc rank0_rc)
read_file(rank1.rc rank1_rc)
read_file(rank0.out rank0_out)
read_file(rank1.out rank1_out)
read_file(badtoken.rc bad_rc)
read_file(badtoken.out bad_out)

if(NOT store_rc STREQUAL "0")
  fail("ncfsm-store exited ${store_rc} after SIGTERM, expected 0")
endif()
set(stats "ncfsm-store: stopping: 3 connections, 2 authenticated, 1 bad token, 0 bad frames, [0-9]+ frames")
if(NOT store_err MATCHES "${stats}")
  fail("ncfsm-store's counters do not match '${stats}'")
endif()
if(NOT rank0_rc STREQUAL "0" OR NOT rank1_rc STREQUAL "0")
  fail("the two ranks exited ${rank0_rc} and ${rank1_rc}, expected 0 and 0")
endif()
set(pass "18/18 PASS \\(sim, NCCL [0-9.]+ \\(modelled\\), 2 ranks, one rank per process")
if(NOT rank0_out MATCHES "${pass}")
  fail("rank 0 does not report '${pass}'")
endif()
if(bad_rc STREQUAL "0" OR bad_rc STREQUAL "124")
  fail("the client with a wrong token exited ${bad_rc}, expected a failure (not 0, not a timeout)")
endif()
set(refused "rejected rank 0: bad token.*check that NCFSM_STORE_TOKEN is the same")
if(NOT bad_out MATCHES "${refused}")
  fail("the client with a wrong token does not say '${refused}'")
endif()

if(NOT failures STREQUAL "")
  message("---- ncfsm-store (exit ${store_rc})\n${store_err}\n"
          "---- rank 0 (exit ${rank0_rc})\n${rank0_out}\n"
          "---- rank 1 (exit ${rank1_rc})\n${rank1_out}\n"
          "---- wrong token (exit ${bad_rc})\n${bad_out}\n----")
  message(FATAL_ERROR "check-store-serve:\n${failures}")
endif()
read_file(port port)
message("check-store-serve: ncfsm-store served 2 ranks on port ${port}, refused a wrong token "
        "and stopped cleanly on SIGTERM:\n${store_err}")
