#!/usr/bin/env bash
# Builds railnet's GPU doorbell test, tests/gpu/doorbell_device_test.cu, into OUTDIR/railnet-doorbell-device-test.
# Needs nvcc only (no NCCL: the doorbell API is railnet's, dlopen'ed from the .so at run time); runs on a machine
# without a GPU. Kernels include include/railnet/doorbell_device.cuh exactly as an application would.
#   scripts/gpu/build-doorbell-device-test.sh [OUTDIR]      (default build/tests/gpu)
# CUDA_HOME (default /usr/local/cuda-13.0) picks nvcc. Code for sm_90 (H100/H200) and sm_80 (A100); GENCODE="..."
# replaces the list.
set -euo pipefail
here=$(dirname "$(realpath "$0")")
root=$(realpath "$here/../..")
out=$(realpath -m "${1:-$root/build/tests/gpu}")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
read -r -a gencode <<< "${GENCODE:--gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80}"
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$root/meson.build" | head -1)
revision=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
mkdir -p "$out"
bin=$out/railnet-doorbell-device-test
set -x
"$CUDA_HOME/bin/nvcc" -std=c++17 -O2 "${gencode[@]}" -Xcompiler -Wall,-Wextra,-Wshadow -Werror all-warnings \
  -DRAILNET_VERSION="\"${version:-unknown}\"" -DRAILNET_REVISION="\"$revision\"" \
  -I "$root/include" -o "$bin" "$root/tests/gpu/doorbell_device_test.cu" -ldl -cudart static
{ set +x; } 2>/dev/null
echo "built $bin"
