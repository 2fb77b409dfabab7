# Source on the GPU machine, from the repository root:
#   . scripts/gpu-env.sh [2.28.3|2.28.9]
# Runtime libraries the host lacks (cmocka; jansson and xxhash where it lacks
# them too) come from .gpu/lib, searched LAST so that the host's own libraries
# win (scripts/gpu-libs.sh fills it on the development machine from its package
# archive, with apt-get download; see docs/results/README.md). It then says
# which library a program of build/ still cannot find (ldd), if any.
# Never put libpmix there: it would shadow the host's PMIx 5, which mpirun's
# plugins need (measured: "undefined symbol: PMIx_Info_create").
# 2.28.3 is the system NCCL; 2.28.9 is the torch wheel's.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$PWD/.gpu/lib"
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# (No command here may fail: the scripts that source this one may run with set -e.)
gpu_env_wheel=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || :)
NCFSM_NCCL_WHEEL_LIB=${gpu_env_wheel:+$gpu_env_wheel/lib}
export NCFSM_NCCL_WHEEL_LIB
if [ "${1:-2.28.3}" = "2.28.9" ]; then
  if [ -n "$NCFSM_NCCL_WHEEL_LIB" ]; then
    export LD_LIBRARY_PATH="$NCFSM_NCCL_WHEEL_LIB:$LD_LIBRARY_PATH"
  else
    echo "gpu-env: 2.28.9: python3 cannot import nvidia.nccl (the torch wheel's NCCL): the system NCCL stays" >&2
  fi
fi
unset gpu_env_wheel
# mpirun forwards these with -x
NCFSM_MPI_ENV="-x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND"
export NCFSM_MPI_ENV
# Every library the build's programs need is found now, or it says which is not.
gpu_env_missing=$(for b in build/tools/ncfsm-info build/tests/test_sim_split; do
  [ -x "$b" ] || continue
  ldd "$b" 2>/dev/null | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' || :
done | sort -u | tr '\n' ' ')
if [ -n "$gpu_env_missing" ]; then
  echo "gpu-env: not found: ${gpu_env_missing}(run scripts/gpu-libs.sh on the development machine, then bring .gpu/lib with the working tree)" >&2
fi
unset gpu_env_missing
