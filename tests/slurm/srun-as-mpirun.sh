#!/usr/bin/env bash
# srun-as-mpirun.sh: what examples/04_failure_matrix/run_matrix.sh calls as
# MPIRUN, turned into srun: `--oversubscribe -np N [-x VAR]... BIN ARGS` ->
# `srun --mpi=pmix -n N --overcommit BIN ARGS` (srun passes the whole
# environment, so -x has nothing to do; --overcommit: more tasks than CPUs).
set -u
np=1
while [ $# -gt 0 ]; do
  case $1 in
    --oversubscribe) shift ;;
    -np|-n) np=$2; shift 2 ;;
    -x) shift 2 ;;
    *) break ;;
  esac
done
exec srun --mpi=pmix -n "$np" --overcommit "$@"
