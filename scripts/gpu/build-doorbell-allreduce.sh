#!/usr/bin/env bash
# Builds railnet's alternating-ring all-reduce on GPU doorbells, tests/gpu/doorbell_allreduce.cu (kernels:
# doorbell_allreduce_kernels.cuh), into OUTDIR/railnet-doorbell-allreduce. Needs nvcc and NCCL's nccl.h and libnccl
# (the program times ncclAllReduce through railnet next to the doorbell ring); the doorbell API itself is dlopen'ed
# from railnet's .so at run time. Runs on a machine without a GPU; every warning is an error.
#   scripts/gpu/build-doorbell-allreduce.sh [OUTDIR]      (default build/tests/gpu)
# CUDA_HOME (default /usr/local/cuda-13.0) picks nvcc; NCCL_HOME (default /usr/local/cuda-13.0, where NCCL 2.28.9 is
# installed) picks include/ and lib/ (the binary's rpath points at that lib; scripts/gpu/doorbell-allreduce.sh puts
# it first on LD_LIBRARY_PATH too). Code for sm_90 (H100/H200) and sm_80 (A100); GENCODE="-gencode ..." replaces
# the list.
set -euo pipefail
here=$(dirname "$(realpath "$0")")
root=$(realpath "$here/../..")
out=$(realpath -m "${1:-$root/build/tests/gpu}")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
NCCL_HOME=${NCCL_HOME:-/usr/local/cuda-13.0}
[ -e "$NCCL_HOME/include/nccl.h" ] || { echo "no nccl.h under $NCCL_HOME/include (set NCCL_HOME)" >&2; exit 2; }
nccl_lib=$NCCL_HOME/lib
[ -e "$nccl_lib/libnccl.so" ] || nccl_lib=$NCCL_HOME/lib64
read -r -a gencode <<< "${GENCODE:--gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80}"
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -1)
revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
mkdir -p "$out"
bin=$out/railnet-doorbell-allreduce
set -x
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 "${gencode[@]}" -Xcompiler -Wall,-Wextra,-Wshadow -Werror all-warnings \
  -DRAILNET_VERSION="\"${version:-unknown}\"" -DRAILNET_REVISION="\"$revision\"" \
  -I "$root/include" -isystem "$NCCL_HOME/include" -o "$bin" "$root/tests/gpu/doorbell_allreduce.cu" \
  -L"$nccl_lib" -lnccl -ldl -cudart static -Xlinker -rpath -Xlinker "$nccl_lib"
{ set +x; } 2>/dev/null
echo "built $bin"
