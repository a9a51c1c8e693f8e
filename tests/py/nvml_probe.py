"""NVIDIA's nvidia-ml-py (pynvml) against the NVML stand-in, beside a
process that allocates through the CUDA stand-in.

Usage: nvml_probe.py LIMIT_BYTES UUID DRIVER_RELEASE (the host's for the
vGPU). Needs LD_LIBRARY_PATH with both stand-ins
first and FAIRVGPU_SOCKET. Prints one line per check; any failure raises.
"""

import ctypes
import subprocess
import sys
import time

import pynvml

CHILD = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: {r}")
ok(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
name = ctypes.create_string_buffer(256)
ok(cu.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
uuid = (ctypes.c_ubyte * 16)()
ok(cu.cuDeviceGetUuid(uuid, dev), "cuDeviceGetUuid")
bus = ctypes.create_string_buffer(32)
ok(cu.cuDeviceGetPCIBusId(bus, 32, dev), "cuDeviceGetPCIBusId")
ctx = ctypes.c_void_p()
ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ptr = ctypes.c_uint64()
ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc")
h = bytes(uuid).hex()
print(name.value.decode(), flush=True)
print(f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}", flush=True)
print(bus.value.decode(), flush=True)
sys.stdin.readline()
"""


SMI_TABLE_ID = bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4")


def export_table(lib, table_id):
    """nvmlInternalGetExportTable as nvidia-smi asks it: (status, size)."""
    table = ctypes.c_void_p()
    guid = ctypes.create_string_buffer(table_id, 16)
    r = lib.nvmlInternalGetExportTable(ctypes.byref(table), guid)
    if r != 0:
        return r, None
    return r, ctypes.c_uint64.from_address(table.value).value


def main():
    limit = int(sys.argv[1])
    want_uuid, want_release = sys.argv[2], sys.argv[3]
    # Before nvmlInit, as a program may ask (pynvml itself asks only after).
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    buf = ctypes.create_string_buffer(80)
    assert lib.nvmlSystemGetNVMLVersion(buf, 80) == 0
    assert buf.value.decode() == "13." + want_release, buf.value
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1, pynvml.nvmlDeviceGetCount()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(f"nvml: devices 1")
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == limit, (mem.total, limit)
    print(f"nvml: total {mem.total}")
    used0 = mem.used

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    cuda_name = child.stdout.readline().strip()
    cuda_uuid = child.stdout.readline().strip()
    cuda_bus = child.stdout.readline().strip()
    assert cuda_name and cuda_uuid and cuda_bus, "the CUDA process said nothing"

    name = pynvml.nvmlDeviceGetName(h)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    assert name == cuda_name, (name, cuda_name)
    assert uuid == cuda_uuid, (uuid, cuda_uuid)
    assert uuid == want_uuid, (uuid, want_uuid)
    print(f"nvml: name and uuid as CUDA's ({name}, {uuid})")
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    cd, cb, cdev = (int(x, 16) for x in cuda_bus.replace(".", ":").split(":")[:3])
    assert (pci.domain, pci.bus, pci.device) == (cd, cb, cdev), (pci.busId, cuda_bus)
    assert pynvml.nvmlDeviceGetHandleByPciBusId(cuda_bus) is not None
    assert pynvml.nvmlDeviceGetHandleByUUID(cuda_uuid) is not None
    print("nvml: pci as CUDA's")

    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.used >= used0 + (64 << 20), (used0, mem.used)
    assert mem.free == mem.total - mem.used
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v2.total == limit and v2.used == mem.used, (v2.total, v2.used)
    print("nvml: used grows by the other process's allocation")
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    mine = [p for p in procs if p.pid == child.pid]
    assert len(mine) == 1 and mine[0].usedGpuMemory >= 64 << 20, [
        (p.pid, p.usedGpuMemory) for p in procs
    ]
    assert all(p.pid != __import__("os").getpid() for p in procs), "NVML is no process"
    print("nvml: the CUDA process listed with its memory")

    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert 0 <= util.gpu <= 100
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert pynvml.nvmlSystemGetDriverVersion() == want_release, pynvml.nvmlSystemGetDriverVersion()
    assert pynvml.nvmlSystemGetNVMLVersion() == "13." + want_release
    assert export_table(lib, SMI_TABLE_ID) == (0, 0), export_table(lib, SMI_TABLE_ID)
    other = bytes(16)
    assert export_table(lib, other)[0] == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
    assert major > 0
    try:
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        raise AssertionError("a temperature the host never gave")
    except pynvml.NVMLError_NotSupported:
        pass
    try:
        pynvml.nvmlDeviceGetHandleByIndex(1)
        raise AssertionError("a second device")
    except pynvml.NVMLError_InvalidArgument:
        pass
    print(f"nvml: versions, utilization, unsupported figures (driver {want_release})")
    print("nvml: nvidia-smi's table given, offering no entry")

    child.stdin.write("\n")
    child.stdin.close()
    assert child.wait() == 0
    deadline = time.time() + 10
    while time.time() < deadline:
        if not pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            break
        time.sleep(0.05)
    assert not pynvml.nvmlDeviceGetComputeRunningProcesses(h), "the process stayed listed"
    print("nvml: the process gone once it exits")
    pynvml.nvmlShutdown()
    print("nvml: all checks passed")


main()
