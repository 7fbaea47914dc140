#!/usr/bin/env python3
# GPU memory one more CUDA context costs (what railnet's CopyContext adds per GPU per process).
#   python3 scripts/gpu/context-cost.py      (on a GPU machine; device 0)
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
def check(r, what):
    if r != 0: raise SystemExit(f"{what}: CUresult {r}")
check(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
primary = ctypes.c_void_p()
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "retain")
check(cu.cuCtxSetCurrent(primary), "set")
free0, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cu.cuMemGetInfo_v2(ctypes.byref(free0), ctypes.byref(total)), "meminfo")
own = ctypes.c_void_p()
check(cu.cuCtxCreate_v2(ctypes.byref(own), 0, dev), "create")
stream = ctypes.c_void_p()
check(cu.cuStreamCreate(ctypes.byref(stream), 1), "stream")
check(cu.cuCtxSetCurrent(primary), "set")
free1 = ctypes.c_size_t()
check(cu.cuMemGetInfo_v2(ctypes.byref(free1), ctypes.byref(total)), "meminfo")
print(f"one more context with a stream: {(free0.value - free1.value) / 2**20:.0f} MiB of {total.value / 2**30:.0f} GiB")
