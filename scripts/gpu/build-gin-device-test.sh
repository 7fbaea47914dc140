#!/usr/bin/env bash
# Builds railnet's NCCL device-API (GIN) test, tests/gpu/gin_device_test.cu, into OUTDIR/railnet-gin-device-test.
# Needs nvcc and NCCL 2.28.9's headers (nccl.h, nccl_device.h; the device API is header-only: no -rdc); runs on a
# machine without a GPU. The binary must run with the libnccl it was compiled against (it checks the version): its
# rpath points at NCCL_HOME's lib, and scripts/gpu/gin-device-test.sh puts that lib first on LD_LIBRARY_PATH.
#   scripts/gpu/build-gin-device-test.sh [OUTDIR]      (default build/tests/gpu)
# CUDA_HOME (default /usr/local/cuda-13.0) picks nvcc; NCCL_HOME (default /usr/local/cuda-13.0, where NCCL 2.28.9 is
# installed) picks include/ and lib/.
# Code for sm_90 (H100/H200) and sm_80 (A100); GENCODE="-gencode ..." replaces the list.
set -euo pipefail
here=$(dirname "$(realpath "$0")")
root=$(realpath "$here/../..")
out=$(realpath -m "${1:-$root/build/tests/gpu}")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
NCCL_HOME=${NCCL_HOME:-/usr/local/cuda-13.0}
[ -e "$NCCL_HOME/include/nccl_device.h" ] || { echo "no nccl_device.h under $NCCL_HOME/include (set NCCL_HOME)" >&2; exit 2; }
nccl_lib=$NCCL_HOME/lib
[ -e "$nccl_lib/libnccl.so" ] || nccl_lib=$NCCL_HOME/lib64
read -r -a gencode <<< "${GENCODE:--gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80}"
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -1)
revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
mkdir -p "$out"
bin=$out/railnet-gin-device-test
set -x
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 "${gencode[@]}" -Xcompiler -Wall,-Wextra \
  -DRAILNET_VERSION="\"${version:-unknown}\"" -DRAILNET_REVISION="\"$revision\"" \
  -isystem "$NCCL_HOME/include" -o "$bin" "$root/tests/gpu/gin_device_test.cu" \
  -L"$nccl_lib" -lnccl -cudart static -Xlinker -rpath -Xlinker "$nccl_lib"
{ set +x; } 2>/dev/null
echo "built $bin"
