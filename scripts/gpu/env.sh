# Sourced by the GPU scripts: how to run 2 ranks on one machine as 2 fake hosts through a net plugin.
#   NCCL_LIB_DIR   directory holding the libnccl.so.2 to use (default: torch's pip NCCL, else the system one)
#   RANKS          processes (default: number of GPUs)
#   RANKS_PER_HOST ranks per fake host (default 1); rank r runs on its host's GPU r mod RANKS_PER_HOST (a block of
#                  GPUs per fake host when there is a GPU per rank, else GPUs 0..RANKS_PER_HOST-1 shared)
#   FAKE_NODES_SHARE_GPUS=1  every fake host uses GPUs 0..RANKS_PER_HOST-1 even when there is a GPU per rank. Real
#                  nodes number their GPUs alike, and NCCL's PXN for send/recv looks for the local GPU with the peer
#                  GPU's NVML index (src/graph/search.cc, ncclTopoGetNetDev): with a block of GPUs per fake host it
#                  finds none, so alltoall and sendrecv never use PXN and NCCL never groups receives.
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
      # Several ranks per fake host: rank r uses the host'"'"'s GPU r mod ranks-per-host (nccl-tests counts local ranks
      # by real hostname, so it must be told), and a {rank} in NCCL_DEBUG_FILE names each rank'"'"'s log. With a GPU
      # per rank, each fake host sees only its own block of GPUs (CUDA_VISIBLE_DEVICES), as a real node would;
      # with fewer, every fake host shares GPUs 0..ranks-per-host-1.
      if [ "$1" -gt 1 ]; then
        export NCCL_TESTS_DEVICE=$((OMPI_COMM_WORLD_RANK % $1))
        if [ "$2" -ge "$OMPI_COMM_WORLD_SIZE" ] && [ "$3" != 1 ]; then
          first=$(( OMPI_COMM_WORLD_RANK / $1 * $1 ))
          export CUDA_VISIBLE_DEVICES=$(seq -s, $first $((first + $1 - 1)))
        fi
      fi
      # One GPU: every rank on it (their kernels time-slice: correctness only, no timings).
      [ "$2" -eq 1 ] && export NCCL_TESTS_DEVICE=0
      [ -n "${NCCL_DEBUG_FILE:-}" ] && export NCCL_DEBUG_FILE=${NCCL_DEBUG_FILE//\{rank\}/$OMPI_COMM_WORLD_RANK}
      shift 3; exec "$@"' _ "${RANKS_PER_HOST:-1}" "$GPUS" "${FAKE_NODES_SHARE_GPUS:-0}" "$@"
}

# Environment that selects a transport: railnet (as users get it, tuner included), railnet-notuner, railnet-gpu
# (GPU memory offered to NCCL, RAILNET_TCP_GPU=1), socket (NCCL's
# default), socket4x4 (NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4), socket4x4ch8 (that and 8 channels at least).
transport_env() {
  case "$1" in
    railnet)   echo "NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=railnet" ;;
    socket)    echo "NCCL_NET_PLUGIN=none NCCL_NET=Socket" ;;
    socket4x4) echo "NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" ;;
    socket4x4ch8) echo "NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" \
                       "NCCL_MIN_NCHANNELS=8 NCCL_MIN_P2P_NCHANNELS=8" ;;
    railnet-notuner) echo "NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=railnet NCCL_TUNER_PLUGIN=none" ;;
    railnet-gpu) echo "NCCL_NET_PLUGIN=$PLUGIN NCCL_NET=railnet RAILNET_TCP_GPU=1" ;;
    *) echo "unknown transport $1" >&2; return 1 ;;
  esac
}
