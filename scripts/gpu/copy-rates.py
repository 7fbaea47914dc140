#!/usr/bin/env python3
# Copy-engine rates railnet's GPU staging sees (docs/performance.md §8): one stream per direction, copies back to
# back between device 0 and registered pinned host memory, from the primary context and from a second context
# (as railnet's CopyContext), for GPU memory from cuMemAlloc and from the cuMem API (as NCCL allocates).
#   python3 scripts/gpu/copy-rates.py      (on a GPU machine; needs only libcuda)
import ctypes, mmap, time, statistics
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, w):
    if r != 0: raise SystemExit(f"{w}: CUresult {r}")
ck(cu.cuInit(0), "init")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
primary = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "retain")
ck(cu.cuCtxSetCurrent(primary), "set")
own = ctypes.c_void_p(); ck(cu.cuCtxCreate_v2(ctypes.byref(own), 0, dev), "create")
ck(cu.cuCtxSetCurrent(primary), "set")
MAX = 8 << 20; SLOTS = 8
d = ctypes.c_uint64(); ck(cu.cuMemAlloc_v2(ctypes.byref(d), MAX * SLOTS), "alloc")
class Loc(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure): _fields_ = [("compressionType", ctypes.c_ubyte), ("gdr", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", Loc), ("win32", ctypes.c_void_p), ("flags", Flags)]
class Access(ctypes.Structure): _fields_ = [("location", Loc), ("flags", ctypes.c_int)]
prop = Prop(); prop.type = 1; prop.location.type = 1; prop.location.id = 0
gran = ctypes.c_size_t(); ck(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "gran")
vsize = ((MAX * SLOTS + gran.value - 1) // gran.value) * gran.value
vmm = ctypes.c_uint64(); handle = ctypes.c_uint64()
ck(cu.cuMemAddressReserve(ctypes.byref(vmm), ctypes.c_size_t(vsize), ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0)), "reserve")
ck(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(vsize), ctypes.byref(prop), ctypes.c_uint64(0)), "create")
ck(cu.cuMemMap(vmm, ctypes.c_size_t(vsize), ctypes.c_size_t(0), handle, ctypes.c_uint64(0)), "map")
acc = Access(); acc.location.type = 1; acc.location.id = 0; acc.flags = 3
ck(cu.cuMemSetAccess(vmm, ctypes.c_size_t(vsize), ctypes.byref(acc), ctypes.c_size_t(1)), "access")
DEV = {"cuMemAlloc": d.value, "vmm": vmm.value}
hostAlloc = ctypes.c_void_p(); ck(cu.cuMemHostAlloc(ctypes.byref(hostAlloc), MAX * SLOTS, 1), "hostalloc")
mm = mmap.mmap(-1, MAX * SLOTS); buf = (ctypes.c_char * (MAX * SLOTS)).from_buffer(mm)
reg = ctypes.addressof(buf); ck(cu.cuMemHostRegister_v2(ctypes.c_void_p(reg), ctypes.c_size_t(MAX * SLOTS), 1), "register")
def streams(ctx):
    ck(cu.cuCtxSetCurrent(ctx), "set")
    s1, s2 = ctypes.c_void_p(), ctypes.c_void_p()
    ck(cu.cuStreamCreate(ctypes.byref(s1), 1), "s"); ck(cu.cuStreamCreate(ctypes.byref(s2), 1), "s")
    return s1, s2
S = {"primary": streams(primary), "own": streams(own)}
def run(ctxname, host, size, mode, n, dev):
    ctx = primary if ctxname == "primary" else own
    ck(cu.cuCtxSetCurrent(ctx), "set")
    s1, s2 = S[ctxname]
    t = time.perf_counter()
    for i in range(n):
        k = i % SLOTS
        h = ctypes.c_void_p(host + k * MAX); g = ctypes.c_uint64(dev + k * MAX)
        if mode in ("d2h", "both"): ck(cu.cuMemcpyDtoHAsync_v2(h, g, ctypes.c_size_t(size), s1), "d2h")
        if mode in ("h2d", "both"):
            h2 = ctypes.c_void_p(host + ((k + 4) % SLOTS) * MAX); g2 = ctypes.c_uint64(dev + ((k + 4) % SLOTS) * MAX)
            ck(cu.cuMemcpyHtoDAsync_v2(g2, h2, ctypes.c_size_t(size), s2), "h2d")
    ck(cu.cuStreamSynchronize(s1), "sync"); ck(cu.cuStreamSynchronize(s2), "sync")
    return time.perf_counter() - t
def lat(ctxname, host, size, dev, n=200):
    ctx = primary if ctxname == "primary" else own
    ck(cu.cuCtxSetCurrent(ctx), "set"); s1, _ = S[ctxname]; v = []
    for i in range(n):
        t = time.perf_counter()
        ck(cu.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(host), ctypes.c_uint64(dev), ctypes.c_size_t(size), s1), "d2h")
        while cu.cuStreamQuery(s1) != 0: pass
        v.append(time.perf_counter() - t)
    return statistics.median(v) * 1e6
print("ctx      device     host        size     d2h GB/s  h2d GB/s  both GB/s(each)  d2h latency us")
for ctxname in ("primary", "own"):
  for dname, dev in DEV.items():
    for hname, host in (("registered", reg),):
        for size in (512 << 10, 1 << 20, 4 << 20):
            n = max(64, (512 << 20) // size)
            run(ctxname, host, size, "both", 16, dev)
            r = {m: n * size / run(ctxname, host, size, m, n, dev) / 1e9 for m in ("d2h", "h2d", "both")}
            print(f"{ctxname:8} {dname:10} {hname:10} {size>>10:6} KiB {r['d2h']:9.1f} {r['h2d']:9.1f} {r['both']:9.1f}        {lat(ctxname, host, size, dev):8.1f}")
