#!/usr/bin/env bash
# run_slurm.sh BUILD OUTDIR
#
# Slurm in CI: a one-node Slurm of its own (munged,
# slurmctld, slurmd, all as root, in OUTDIR/state with its own key, socket,
# ports and logs; nothing of the machine's /etc/slurm or /run/munge), then,
# through `srun --mpi=pmix` (Slurm's mpi_pmix_v4 plugin, the PMIx ncfsm links):
#   1. srun --mpi=list lists pmix;
#   2. the demo (examples/02_group_semantics), 4 tasks on the sim: one summary
#      "36/36 PASS (... 4 ranks, one rank per process ...)", not four one-process runs;
#   3. the failure matrix, 4 ranks (run_matrix.sh with srun for mpirun), --report --check;
#   4. the recovery example: srun launches 4 tasks that meet through a
#      standalone ncfsm-store (the PMIx bootstrap has no recovery), rank 3
#      SIGKILLs itself in flight, 05_recovery --report --check;
#   5. the service (examples/06_service), 2 tasks: both answer /healthz, a
#      vector posted to rank 0 shows in rank 1's /average, and
#      `scancel --signal=TERM` stops both with exit 0.
#   6. the tutorial's srun block (docs/tutorial.md, run `srun`), through
#      tests/docs/check_runs.py: it prints the page's output block;
#   7. the demo under srun --mpi=none, 2 tasks: each refuses to run alone
#      (SLURM_NTASKS=2 and no PMIx), exit non-zero, no PASS.
# Every daemon is stopped by its pid at the end; the state folder (in /tmp, for
# the unix sockets' length) is removed, its logs kept in OUTDIR/state. Exit 77 (skipped, with the
# reason) where Slurm or munge is not installed or the cluster does not come up.
set -u
build=${1:?usage: run_slurm.sh BUILD OUTDIR}
out=${2:?usage: run_slurm.sh BUILD OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "the one-node Slurm runs its daemons as root (run as root, as CI does)"
for c in munged slurmctld slurmd srun sinfo squeue scancel curl; do
  command -v $c >/dev/null || skip "no $c (scripts/install-deps.sh installs munge, slurmctld, slurmd, slurm-client, curl)"
done
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix_v4.so ] || ls /usr/lib/*/slurm*/mpi_pmix*.so >/dev/null 2>&1 ||
  skip "Slurm has no mpi_pmix plugin (slurm-wlm-basic-plugins)"
rm -rf "$out" && mkdir -p "$out" || exit 2
# the daemons' state in a short folder of its own (munge's and slurmd's unix sockets must
# fit in 108 bytes, whatever the build folder's path); its logs are copied to OUTDIR/state
st=$(mktemp -d /tmp/ncfsm-slurm.XXXXXX) || exit 2
mkdir -p "$st/munge" "$st/ctld" "$st/spool" "$st/pmix" && chmod 700 "$st/munge"
pids=()
stop_all() { # every daemon started here, by its pid: TERM, then KILL after 10 s
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  pids=()
  mkdir -p "$out/state"
  cp "$st"/*.log "$st"/*.out "$st/slurm.conf" "$st/munge/log" "$out/state/" 2>/dev/null
  rm -rf "$st"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

free_port() { # a port nobody listens on (python3 where it is, else a random one that ss does not list)
  python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])' 2>/dev/null && return
  local p
  while p=$((20000 + RANDOM % 20000)); ss -ltn 2>/dev/null | grep -q ":$p "; do :; done
  echo $p
}

# munge: a key and a socket of its own
head -c 1024 /dev/urandom >"$st/munge/munge.key" && chmod 400 "$st/munge/munge.key"
munged -F -f --key-file="$st/munge/munge.key" --socket="$st/munge/sock" --pid-file="$st/munge/pid" \
  --log-file="$st/munge/log" --seed-file="$st/munge/seed" >"$st/munge/out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$st/munge/sock" ] && break; sleep 0.05; done
[ -S "$st/munge/sock" ] || skip "munged did not start: $(tail -2 "$st/munge/log" "$st/munge/out" 2>/dev/null)"

node=$(slurmd -C | head -1)
host=$(hostname -s)
cat >"$st/slurm.conf" <<EOF
ClusterName=ncfsm$$
FirstJobId=$(( ($$ % 20000) * 1000 + 1 ))
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$st/munge/sock
StateSaveLocation=$st/ctld
SlurmdSpoolDir=$st/spool
SlurmctldPidFile=$st/slurmctld.pid
SlurmdPidFile=$st/slurmd.pid
SlurmctldLogFile=$st/slurmctld.log
SlurmdLogFile=$st/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
$node State=UNKNOWN
PartitionName=ncfsm Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
# the pmix plugin's folders in the state folder too (by default /tmp/spmix_appdir_<uid>_<job>.<step>:
# a fresh cluster counts jobs from FirstJobId again, and another run's leftovers collide)
echo "PMIxCliTmpDirBase=$st/pmix" >"$st/mpi.conf"
export SLURM_CONF=$st/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$st/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$st/slurmd.out" 2>&1 &
pids+=($!)
up=0
for _ in $(seq 150); do
  s=$(sinfo -h -o %T 2>/dev/null | head -1)
  [ "$s" = idle ] && { up=1; break; }
  sleep 0.2
done
[ $up -eq 1 ] || skip "the one-node Slurm did not come up within 30 s (node state '${s:-none}'): $(tail -3 "$st/slurmctld.log" "$st/slurmd.log" 2>/dev/null)"
echo "slurm: one node up ($(sinfo -h -o '%N %c CPUs %T'), state in $st, logs to $out/state)"

fail=0
check() { # $1: what, $2: status
  if [ "$2" -eq 0 ]; then echo "PASS: $1"; else echo "FAIL: $1"; fail=1; fi
}
export NCFSM_BACKEND=sim NCCL_NVLS_ENABLE=0
unset NCFSM_STORE_ADDR NCFSM_BOOTSTRAP NCFSM_STORE_HOST PMIX_RANK

# 1. the pmix plugin
srun --mpi=list >"$out/mpi-list.txt" 2>&1
grep -q pmix "$out/mpi-list.txt"
check "srun --mpi=list lists pmix ($(grep -o 'pmix[_a-z0-9]*' "$out/mpi-list.txt" | sort -u | tr '\n' ' '))" $?

# 2. the demo, 4 tasks
timeout -k 5 120 srun --mpi=pmix -n 4 --overcommit "$build/examples/02_group_semantics" >"$out/demo.txt" 2>&1
rc=$?
n1=$(grep -c '^36/36 PASS (sim, NCCL [0-9.]* (modelled), 4 ranks, one rank per process' "$out/demo.txt")
n2=$(grep -c 'ranks, one process' "$out/demo.txt")
[ $rc -eq 0 ] && [ "$n1" -eq 1 ] && [ "$n2" -eq 0 ]
check "demo: srun --mpi=pmix -n 4: one '36/36 PASS ... 4 ranks, one rank per process' line ($n1), no one-process run ($n2), exit $rc" $?

# 3. the failure matrix, 4 ranks, with srun for mpirun
MPIRUN=$here/srun-as-mpirun.sh BUILD=$build CASE_TIMEOUT=90 timeout -k 5 900 \
  "$root/examples/04_failure_matrix/run_matrix.sh" 4 "$out/matrix" >"$out/matrix.txt" 2>&1
rc=$?
check "failure matrix: 4 ranks under srun, --report --check ($(grep -c '^| ' "$out/matrix/report.md" 2>/dev/null) table rows), exit $rc" $rc

# 4. recovery: srun launches, the TCP store is the bootstrap (pmix has no recovery)
export NCFSM_STORE_TOKEN="slurm-$$-$RANDOM"
"$build/tools/ncfsm-store" --listen 127.0.0.1:0 --print-port >"$out/rec-port" 2>"$out/rec-store.err" &
spid=$!
pids+=($spid)
for _ in $(seq 100); do grep -q '^[0-9]' "$out/rec-port" 2>/dev/null && break; sleep 0.05; done
mkdir -p "$out/rec"
NCFSM_STORE_ADDR=127.0.0.1:$(cat "$out/rec-port") NCFSM_WORLD_SIZE=4 NCFSM_BOOTSTRAP=tcp timeout -k 5 180 \
  srun --mpi=none -n 4 --overcommit --kill-on-bad-exit=0 sh -c 'NCFSM_RANK=$SLURM_PROCID exec "$0" "$@" >"'"$out"'/rec/rank$SLURM_PROCID.out" 2>&1; ' \
  "$build/examples/05_recovery" --iters 40 --victim 3 --kill-at 10 --kill-point inflight --out "$out/rec" \
  >"$out/rec.txt" 2>&1
rcs=""
for r in 0 1 2; do rcs="$rcs $(grep -q "^rank $r: 40 iterations, 0 wrong, 1 recovery" "$out/rec/rank$r.out" && echo 0 || echo 1)"; done
grep -q "^rank 3: SIGKILL at iteration 10" "$out/rec/rank3.out" && rcs="$rcs 137" || rcs="$rcs 0"
"$build/examples/05_recovery" --report "$out/rec" --np 4 --victim 3 --exits "$rcs" --check >"$out/rec/report.md"
check "recovery: srun -n 4 over the TCP store, rank 3 SIGKILLed in flight, --report --check" $?
kill -TERM $spid

# 5. the service, 2 tasks; scancel --signal=TERM stops them
rm -f "$out"/svc.port.*
srun --mpi=pmix -n 2 --overcommit --job-name="ncfsm-svc-$$" "$build/examples/06_service" --count 4 \
  --interval-ms 20 --port-file "$out/svc.port.%r" >"$out/svc.txt" 2>&1 &
srun_pid=$!
for _ in $(seq 300); do [ -s "$out/svc.port.0" ] && [ -s "$out/svc.port.1" ] && break; sleep 0.1; done
p0=$(cat "$out/svc.port.0" 2>/dev/null) p1=$(cat "$out/svc.port.1" 2>/dev/null)
h0=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p0/healthz")
h1=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p1/healthz")
post=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '[1,2,3,4]' "http://127.0.0.1:$p0/submit")
avg=""
for _ in $(seq 50); do
  avg=$(curl -s "http://127.0.0.1:$p1/average")
  echo "$avg" | grep -q '1\(\.0*\)\?, *2\(\.0*\)\?, *3\(\.0*\)\?, *4' && break
  sleep 0.1
done
job=$(squeue -h -n "ncfsm-svc-$$" -o %i | head -1)
scancel --signal=TERM "$job"
rc=124
for _ in $(seq 300); do kill -0 $srun_pid 2>/dev/null || { wait $srun_pid; rc=$?; break; }; sleep 0.1; done
[ $rc -eq 124 ] && { kill -KILL $srun_pid; scancel "$job"; }
[ "$h0" = 200 ] && [ "$h1" = 200 ] && [ "$post" = 202 ] && echo "$avg" | grep -q '4' && [ $rc -eq 0 ]
check "service: srun -n 2: /healthz $h0 $h1, POST /submit $post, rank 1's /average $avg, scancel --signal=TERM: exit $rc" $?

# 6. the tutorial's srun block (docs/tutorial.md, run srun): what it prints is the page's block
python3 "$root/tests/docs/check_runs.py" --root "$root" --build "$build" --run srun docs/tutorial.md \
  >"$out/tutorial.txt" 2>&1
check "tutorial: its block 'srun --mpi=pmix -n 2 build/tutorial/ranks' prints the page's output" $?

# 7. without --mpi=pmix the tasks have no way to meet: each stops with the reason, none runs alone
timeout -k 5 60 srun --mpi=none -n 2 --overcommit "$build/examples/02_group_semantics" --count 1024 \
  >"$out/nopmix.txt" 2>&1
rc=$?
n1=$(grep -c '^02_group_semantics: bootstrap: launched as 2 tasks (SLURM_NTASKS=2)' "$out/nopmix.txt")
n2=$(grep -c 'PASS' "$out/nopmix.txt")
[ $rc -ne 0 ] && [ "$n1" -eq 2 ] && [ "$n2" -eq 0 ]
check "demo: srun --mpi=none -n 2: both tasks refuse ($n1 of 2 name SLURM_NTASKS=2), no PASS ($n2), exit $rc" $?

[ $fail -eq 0 ] && echo "slurm: PASS" || { echo "slurm: FAIL (logs in $out)"; tail -5 "$st/slurmctld.log" "$st/slurmd.log"; }
exit $fail
