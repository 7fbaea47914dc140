#!/usr/bin/env python3
# Does a copy issued from another CUDA context wait for a time slice while a kernel spins on the GPU? (performance.md
# §11, D70.) One kernel of the primary context spins on a flag in mapped host memory (as an NCCL kernel spins
# waiting for data); meanwhile 8-byte copies are timed, issue to completion, from a second context (railnet's
# CopyContext), from another stream of the primary context, and with nothing spinning, H2D and D2H.
#   python3 scripts/gpu/timeslice-probe.py [DEVICE]     (on a GPU machine; needs only libcuda)
import ctypes, statistics, sys, time
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        raise SystemExit(f"{what}: CUresult {r}")
ck(cu.cuInit(0), "cuInit")
ordinal = int(sys.argv[1]) if len(sys.argv) > 1 else 0
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
major = ctypes.c_int(); minor = ctypes.c_int()
ck(cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev), "cc major")
ck(cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev), "cc minor")
primary = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "retain")
ck(cu.cuCtxSetCurrent(primary), "set primary")
second = ctypes.c_void_p(); ck(cu.cuCtxCreate_v2(ctypes.byref(second), 0, dev), "cuCtxCreate")
ck(cu.cuCtxSetCurrent(primary), "set primary")

PTX = f""".version 7.8
.target sm_{major.value}{minor.value}
.address_size 64
.visible .entry spin(.param .u64 flag, .param .u64 limit)
{{
  .reg .u64 %rd<5>; .reg .u32 %r<2>; .reg .pred %p<3>;
  ld.param.u64 %rd1, [flag];
  ld.param.u64 %rd2, [limit];
  mov.u64 %rd3, 0;
LOOP:
  ld.volatile.global.u32 %r1, [%rd1];
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra DONE;
  add.u64 %rd3, %rd3, 1;
  setp.lt.u64 %p2, %rd3, %rd2;
  @%p2 bra LOOP;
DONE:
  ret;
}}
""".encode() + b"\0"
module = ctypes.c_void_p(); ck(cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
spin = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(spin), module, b"spin"), "cuModuleGetFunction")

# The flag: pinned, mapped host memory (portable + devicemap), visible to the kernel.
flag_host = ctypes.c_void_p(); ck(cu.cuMemHostAlloc(ctypes.byref(flag_host), 64, 1 | 2), "cuMemHostAlloc")
flag_dev = ctypes.c_uint64(); ck(cu.cuMemHostGetDevicePointer_v2(ctypes.byref(flag_dev), flag_host, 0), "devptr")
flag = ctypes.cast(flag_host, ctypes.POINTER(ctypes.c_uint32))

BYTES = 4 << 20
def setup(ctx):
    ck(cu.cuCtxSetCurrent(ctx), "set")
    stream = ctypes.c_void_p(); ck(cu.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    gpu = ctypes.c_uint64(); ck(cu.cuMemAlloc_v2(ctypes.byref(gpu), BYTES), "cuMemAlloc")
    host = ctypes.c_void_p(); ck(cu.cuMemHostAlloc(ctypes.byref(host), BYTES, 1 | 2), "cuMemHostAlloc")
    mapped = ctypes.c_uint64(); ck(cu.cuMemHostGetDevicePointer_v2(ctypes.byref(mapped), host, 0), "devptr")
    return stream, gpu, host, mapped
lanes = {"second context": (second, setup(second)), "primary, other stream": (primary, setup(primary))}
ck(cu.cuCtxSetCurrent(primary), "set")
spin_stream = ctypes.c_void_p(); ck(cu.cuStreamCreate(ctypes.byref(spin_stream), 1), "spin stream")

def latency(ctx, lane, direction, size=8, n=40):
    stream, gpu, host, mapped = lane
    ck(cu.cuCtxSetCurrent(ctx), "set")
    times = []
    for _ in range(n):
        t = time.perf_counter()
        if direction == "H2D":
            ck(cu.cuMemcpyHtoDAsync_v2(gpu, host, ctypes.c_size_t(size), stream), "h2d")
        elif direction == "D2D from mapped host":
            ck(cu.cuMemcpyDtoDAsync_v2(gpu, mapped, ctypes.c_size_t(size), stream), "d2d mapped")
        elif direction == "D2D":
            ck(cu.cuMemcpyDtoDAsync_v2(gpu, ctypes.c_uint64(gpu.value + BYTES // 2), ctypes.c_size_t(size), stream), "d2d")
        elif direction == "memset":
            ck(cu.cuMemsetD8Async(gpu, ctypes.c_ubyte(7), ctypes.c_size_t(size), stream), "memset")
        else:
            ck(cu.cuMemcpyDtoHAsync_v2(host, gpu, ctypes.c_size_t(size), stream), "d2h")
        while cu.cuStreamQuery(stream) != 0:
            pass
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times), max(times)

def launch_spin():
    flag[0] = 0
    ck(cu.cuCtxSetCurrent(primary), "set")
    args = (ctypes.c_void_p * 2)(ctypes.addressof(flag_dev), ctypes.addressof(ctypes.c_uint64(1 << 40)))
    limit = ctypes.c_uint64(1 << 40)
    args[1] = ctypes.addressof(limit)
    ck(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, spin_stream, args, None), "cuLaunchKernel")
    time.sleep(0.05)
    return limit

print(f"GPU {ordinal} (sm_{major.value}{minor.value}): copies, issue to completion, median / max us over 40")
for spinning in (False, True):
    keep = launch_spin() if spinning else None
    for name, (ctx, lane) in lanes.items():
        for direction in ("H2D", "D2H", "D2D from mapped host", "D2D", "memset"):
            for size in (8, 4096, 8192, 16384, 32768, 65536, 1 << 20):
                if size > 8 and name != "second context":
                    continue
                median, worst = latency(ctx, lane, direction, size, n=40 if size < (1 << 20) or spinning else 10)
                print(f"  kernel spinning: {'yes' if spinning else 'no '}  {name:22s} {direction:21s} {size:8d} B: "
                      f"{median:8.1f} / {worst:8.1f}")
    if spinning:
        flag[0] = 1
        ck(cu.cuCtxSetCurrent(primary), "set")
        ck(cu.cuStreamSynchronize(spin_stream), "spin end")
        del keep
