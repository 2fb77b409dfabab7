#!/bin/sh
# docs/tutorial/tcp.sh [BUILD]: the tutorial's ranks.c as two processes that
# meet through the TCP store (docs/tutorial.md, "Without a launcher: the TCP
# store"): a standalone ncfsm-store on a free loopback port, then one
# process per rank with NCFSM_STORE_ADDR, NCFSM_RANK and NCFSM_WORLD_SIZE.
# Exit status: 0 when both ranks exited 0.
build=${1:-build}
# [store]
export NCFSM_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')   # the job's secret
port=$(mktemp)
"$build/tools/ncfsm-store" --listen 127.0.0.1:0 --print-port >"$port" 2>/dev/null &
store=$!
until [ -s "$port" ] || ! kill -0 $store 2>/dev/null; do sleep 0.05; done
export NCFSM_STORE_ADDR=127.0.0.1:$(cat "$port") NCFSM_WORLD_SIZE=2
NCFSM_RANK=0 "$build/tutorial/ranks" &
rank0=$!
NCFSM_RANK=1 "$build/tutorial/ranks"
rc1=$?
wait $rank0
rc0=$?
kill $store
# [/store]
wait $store 2>/dev/null
rm -f "$port"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
