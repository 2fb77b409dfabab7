# Source on the GPU machine, from the repository root:
#   . scripts/gpu-env.sh [2.28.3|2.28.9]
# Runtime libraries the host lacks (jansson, cmocka, xxhash) come from
# .gpu/lib, searched LAST so that the host's own libraries win
# (scripts/gpu-libs.sh fills it on the development machine from its package
# archive, with apt-get download; see docs/results/README.md).
# Never put libpmix there: it would shadow the host's PMIx 5, which mpirun's
# plugins need (measured: "undefined symbol: PMIx_Info_create").
# 2.28.3 is the system NCCL; 2.28.9 is the torch wheel's.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$PWD/.gpu/lib"
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NCFSM_NCCL_WHEEL_LIB="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/lib"
export NCFSM_NCCL_WHEEL_LIB
if [ "${1:-2.28.3}" = "2.28.9" ]; then
  export LD_LIBRARY_PATH="$NCFSM_NCCL_WHEEL_LIB:$LD_LIBRARY_PATH"
fi
# mpirun forwards these with -x
NCFSM_MPI_ENV="-x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND"
export NCFSM_MPI_ENV
