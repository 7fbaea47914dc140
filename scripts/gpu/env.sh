# Sourced by the GPU scripts: how to run 2 ranks on one machine as 2 fake hosts through a net plugin.
#   NCCL_LIB_DIR   directory holding the libnccl.so.2 to use (default: torch's pip NCCL, else the system one)
#   RANKS          processes (default: number of GPUs)
#   RANKS_PER_HOST ranks per fake host (default 1); rank r runs on GPU r mod RANKS_PER_HOST
set -euo pipefail

if [ -z "${NCCL_LIB_DIR:-}" ]; then
  NCCL_LIB_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
                 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)
fi
GPUS=$(nvidia-smi -L | wc -l)
RANKS=${RANKS:-$GPUS}
export NCCL_NVLS_ENABLE=0          # required on the shared GPU machines
# railnet reads NCCL's interface choice when RAILNET_IFNAME is unset (issue 16): one variable for both.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}

# mpirun_ranks ENV... -- COMMAND...: one process per rank, each its own "host" (NCCL_HOSTID), no CPU binding
# (mpirun binds each rank to one core by default, which starves any transport's helper threads).
mpirun_ranks() {
  local envs=()
  while [ "$1" != "--" ]; do envs+=(-x "$1"); shift; done
  shift
  mpirun --allow-run-as-root --bind-to none -np "$RANKS" \
    -x LD_LIBRARY_PATH="$NCCL_LIB_DIR:${PLUGIN_DIR:-}:${LD_LIBRARY_PATH:-}" -x NCCL_NVLS_ENABLE \
    -x NCCL_SOCKET_IFNAME "${envs[@]}" \
    bash -c '
      export NCCL_HOSTID=fakehost$((OMPI_COMM_WORLD_RANK / $1))
      # Several ranks per fake host: rank r uses GPU r mod ranks-per-host (nccl-tests counts local ranks by real
      # hostname, so it must be told), and a {rank} in NCCL_DEBUG_FILE names each rank'"'"'s log.
      [ "$1" -gt 1 ] && export NCCL_TESTS_DEVICE=$((OMPI_COMM_WORLD_RANK % $1))
      # One GPU: every rank on it (their kernels time-slice: correctness only, no timings).
      [ "$2" -eq 1 ] && export NCCL_TESTS_DEVICE=0
      [ -n "${NCCL_DEBUG_FILE:-}" ] && export NCCL_DEBUG_FILE=${NCCL_DEBUG_FILE//\{rank\}/$OMPI_COMM_WORLD_RANK}
      shift 2; exec "$@"' _ "${RANKS_PER_HOST:-1}" "$GPUS" "$@"
}

# Environment that selects a transport: railnet, socket (NCCL default), socket4x4 (NCCL at its best tuning).
transport_env() {
  case "$1" in
    railnet)   echo "NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=railnet" ;;
    socket)    echo "NCCL_NET_PLUGIN=none NCCL_NET=Socket" ;;
    socket4x4) echo "NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" ;;
    *) echo "unknown transport $1" >&2; return 1 ;;
  esac
}
