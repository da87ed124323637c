"""Runs on the target host (shipped inside the probe script): CUDA through libcuda, as JSON.

Standard library only: the CUDA driver library (libcuda.so.1, part of every NVIDIA driver)
through ctypes, and NVML (libnvidia-ml.so.1) for samples. Changes no setting.

  smoke         per GPU: a context, an allocation, a copy in, a kernel, a copy out, checked.
  load SECONDS  a compute kernel on every GPU for SECONDS while NVML samples P-state, SM
                clock, utilisation, power and clock-event reasons every 250 ms.
"""
import ctypes
import json
import os
import sys
import threading
import time

os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA ordinals in NVML order

PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry add_one(.param .u64 src, .param .u64 dst, .param .u32 n)
{
  .reg .pred p;
  .reg .b32 r<5>;
  .reg .f32 f<3>;
  .reg .b64 d<6>;
  ld.param.u64 d1, [src];
  ld.param.u64 d2, [dst];
  ld.param.u32 r1, [n];
  mov.u32 r2, %ctaid.x;
  mov.u32 r3, %ntid.x;
  mov.u32 r4, %tid.x;
  mad.lo.s32 r2, r2, r3, r4;
  setp.ge.u32 p, r2, r1;
  @p bra DONE;
  cvta.to.global.u64 d1, d1;
  cvta.to.global.u64 d2, d2;
  mul.wide.u32 d3, r2, 4;
  add.s64 d4, d1, d3;
  add.s64 d5, d2, d3;
  ld.global.f32 f1, [d4];
  add.f32 f2, f1, 0f3F800000;
  st.global.f32 [d5], f2;
DONE:
  ret;
}
.visible .entry spin(.param .u64 dst, .param .u32 iters)
{
  .reg .pred p;
  .reg .b32 r<6>;
  .reg .f32 f<5>;
  .reg .b64 d<4>;
  ld.param.u64 d1, [dst];
  ld.param.u32 r1, [iters];
  mov.u32 r2, %ctaid.x;
  mov.u32 r3, %ntid.x;
  mov.u32 r4, %tid.x;
  mad.lo.s32 r2, r2, r3, r4;
  cvt.rn.f32.u32 f1, r2;
  mov.f32 f2, f1;
  mov.f32 f3, 0f3F000000;
  mov.u32 r5, 0;
LOOP:
  setp.ge.u32 p, r5, r1;
  @p bra STORE;
  fma.rn.f32 f2, f2, 0f3F7FF972, 0f3F800000;
  fma.rn.f32 f3, f3, 0f3F7FF972, 0f3F000000;
  add.u32 r5, r5, 1;
  bra LOOP;
STORE:
  add.f32 f4, f2, f3;
  cvta.to.global.u64 d1, d1;
  and.b32 r2, r2, 1023;
  mul.wide.u32 d2, r2, 4;
  add.s64 d3, d1, d2;
  st.global.f32 [d3], f4;
  ret;
}
\x00"""

N = 1 << 20  # floats per smoke-test buffer (4 MiB)
REASONS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}


class CudaError(Exception):
    pass


def load_cuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def check(cu, rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(rc, ctypes.byref(name))
        raise CudaError(f"{what}: {name.value.decode() if name.value else rc} ({rc})")


def bus_id(cu, dev):
    buf = ctypes.create_string_buffer(32)
    check(cu, cu.cuDeviceGetPCIBusId(buf, 32, dev), "cuDeviceGetPCIBusId")
    return buf.value.decode().lower()


class Device:
    """A GPU and its primary context, with the probe module loaded."""

    def __init__(self, cu, ordinal):
        self.cu = cu
        self.dev = ctypes.c_int()
        check(cu, cu.cuDeviceGet(ctypes.byref(self.dev), ordinal), "cuDeviceGet")
        self.bdf = bus_id(cu, self.dev)
        self.ctx = ctypes.c_void_p()
        check(cu, cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
        self.current()
        self.mod = ctypes.c_void_p()
        rc = cu.cuModuleLoadData(ctypes.byref(self.mod), PTX)
        if rc != 0:  # a driver whose JIT no longer takes sm_50 PTX
            rc = cu.cuModuleLoadData(ctypes.byref(self.mod), PTX.replace(b".version 6.0\n.target sm_50", b".version 7.0\n.target sm_75"))
        check(cu, rc, "cuModuleLoadData")

    def current(self):
        check(self.cu, self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def function(self, name):
        fn = ctypes.c_void_p()
        check(self.cu, self.cu.cuModuleGetFunction(ctypes.byref(fn), self.mod, name), "cuModuleGetFunction")
        return fn

    def alloc(self, size):
        ptr = ctypes.c_uint64()
        check(self.cu, self.cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
        return ptr

    def launch(self, fn, blocks, args):
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        check(self.cu, self.cu.cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, None, params, None), "cuLaunchKernel")
        check(self.cu, self.cu.cuCtxSynchronize(), "kernel")

    def close(self):
        self.cu.cuModuleUnload(self.mod)
        self.cu.cuDevicePrimaryCtxRelease_v2(self.dev)


def smoke_one(cu, ordinal, host):
    start = time.monotonic()
    gpu = Device(cu, ordinal)
    try:
        out = (ctypes.c_float * N)()
        src, dst = gpu.alloc(N * 4), gpu.alloc(N * 4)
        check(cu, cu.cuMemcpyHtoD_v2(src, host, ctypes.c_size_t(N * 4)), "cuMemcpyHtoD")
        gpu.launch(gpu.function(b"add_one"), N // 256, [src, dst, ctypes.c_uint32(N)])
        check(cu, cu.cuMemcpyDtoH_v2(out, dst, ctypes.c_size_t(N * 4)), "cuMemcpyDtoH")
        bad = sum(1 for i in range(0, N, 997) if out[i] != host[i] + 1.0)
        cu.cuMemFree_v2(src)
        cu.cuMemFree_v2(dst)
        if bad:
            raise CudaError(f"kernel result wrong in {bad} of {len(range(0, N, 997))} sampled elements")
        return {"bdf": gpu.bdf, "ok": True, "ms": round((time.monotonic() - start) * 1000, 1)}
    finally:
        gpu.close()


def init():
    cu = load_cuda()
    if cu is None:
        return None, None, "libcuda.so.1 not found"
    try:
        check(cu, cu.cuInit(0), "cuInit")
        count = ctypes.c_int()
        check(cu, cu.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    except CudaError as exc:
        return cu, 0, str(exc)
    return cu, count.value, None


def smoke_into(results, cu, ordinal, host):
    try:
        results[ordinal] = {"index": ordinal, **smoke_one(cu, ordinal, host)}
    except CudaError as exc:
        results[ordinal] = {"index": ordinal, "bdf": "", "ok": False, "error": str(exc)}
    except (AttributeError, OSError) as exc:  # a libcuda without one of these entry points
        results[ordinal] = {"index": ordinal, "bdf": "", "ok": False, "error": f"{type(exc).__name__}: {exc}"}


def smoke():
    """Every GPU at once, one thread each: creating a context takes most of a second per GPU."""
    cu, count, error = init()
    out = {"runtime": None if cu is None else "libcuda", "error": error, "gpus": []}
    host = (ctypes.c_float * N)(*[float(i % 4096) for i in range(N)]) if count else None
    results = [None] * (count or 0)
    threads = [threading.Thread(target=smoke_into, args=(results, cu, i, host)) for i in range(count or 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["gpus"] = [r or {"index": i, "bdf": "", "ok": False, "error": "no result"} for i, r in enumerate(results)]
    return out


class Nvml:
    """The few NVML calls the sampler needs."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        count = ctypes.c_uint()
        self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        self.handles = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
            self.handles.append(h)
        self.reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if self.reasons is None:
            self.reasons = self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def uint(self, fn, h, *args):
        value = ctypes.c_uint()
        return value.value if fn(h, *args, ctypes.byref(value)) == 0 else None

    def sample(self, i):
        h, lib = self.handles[i], self.lib
        util = (ctypes.c_uint * 2)()
        mask = ctypes.c_ulonglong()
        pstate = self.uint(lib.nvmlDeviceGetPerformanceState, h)
        power = self.uint(lib.nvmlDeviceGetPowerUsage, h)
        has_mask = self.reasons(h, ctypes.byref(mask)) == 0
        return {
            "gpu": i,
            "pstate": None if pstate is None else f"P{pstate}",
            "sm_mhz": self.uint(lib.nvmlDeviceGetClockInfo, h, 1),
            "sm_max_mhz": self.uint(lib.nvmlDeviceGetMaxClockInfo, h, 1),
            "util_pct": util[0] if lib.nvmlDeviceGetUtilizationRates(h, util) == 0 else None,
            "power_w": None if power is None else power / 1000.0,
            "reasons": [k for k, bit in REASONS.items() if has_mask and mask.value & bit],
        }


def spin(cu, ordinal, deadline, errors):
    try:
        gpu = Device(cu, ordinal)
        dst = gpu.alloc(4096)
        fn = gpu.function(b"spin")
        iters = 1 << 12
        while time.monotonic() < deadline:
            t = time.monotonic()
            gpu.launch(fn, 132 * 16, [dst, ctypes.c_uint32(iters)])
            if time.monotonic() - t < 0.05 and iters < 1 << 28:
                iters *= 2  # grow each launch towards ~50-100 ms, so the deadline holds
        cu.cuMemFree_v2(dst)
        gpu.close()
    except (CudaError, AttributeError, OSError) as exc:
        errors.append(f"GPU{ordinal}: {exc}")


def load(seconds):
    cu, count, error = init()
    if error or not count:
        return {"error": error or "no CUDA device"}
    try:
        nvml = Nvml()
    except (OSError, AttributeError) as exc:
        return {"error": f"NVML unavailable for sampling: {exc}"}
    errors, samples = [], []
    start = time.monotonic()
    deadline = start + seconds
    workers = [threading.Thread(target=spin, args=(cu, i, deadline, errors)) for i in range(count)]
    for w in workers:
        w.start()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        if time.monotonic() - start >= 1.0:  # the first second is the clocks ramping up
            samples += [nvml.sample(i) for i in range(len(nvml.handles))]
    for w in workers:
        w.join()
    return {"seconds": round(time.monotonic() - start, 2), "error": "; ".join(errors) or None, "samples": samples}


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "smoke"
    out = load(float(sys.argv[2])) if mode == "load" else smoke()
    print(json.dumps(out))


main()
