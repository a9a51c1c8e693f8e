#!/usr/bin/env bash
# On the GPU machine: NVIDIA's own nvidia-smi and PyTorch's NVML queries
# against the NVML stand-in (libnvidia-ml.so.1) beside the CUDA one, through
# a one-VM daemon on the cuda executor. Carried: the release fairvgpu,
# libcuda.so and libnvidia_ml.so in $R (default .carry/release).
# Prints the host's nvidia-smi, then the stand-in's (full and as CSV), what
# CUDA says through the stand-in (name, UUID, PCI bus id) and what torch
# says. With FAIRVGPU_NVML_DEBUG set, the stand-in names on stderr every
# entry point it does not serve, slots of nvidia-smi's private table
# (nvmlInternalGetExportTable) included. Last line:
#   nvml_devices=N nvml_total_mib=M uuid_match=0|1 pci_match=0|1 torch_ok=0|1
#   driver_match=0|1 own_uuid=0|1 smi_ok=0|1
# Expected: nvml_devices=1, nvml_total_mib = the VM's limit (8192), the rest 1
# (driver_match: the stand-in's driver version is the host's; own_uuid: the
# vGPU's UUID is not the physical GPU's; smi_ok: nvidia-smi printed its
# table, with no "Mismatch in versions").
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
MIB=8192
W=/tmp/fvg-nvml; rm -rf $W; mkdir -p $W/lib
cp $R/libcuda.so $W/lib/libcuda.so.1; cp $R/libcuda.so $W/lib/libcuda.so
cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so.1; cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so
header
echo "== the host's nvidia-smi"
nvidia-smi
nvidia-smi --query-gpu=driver_version,uuid --format=csv,noheader > $W/host.csv
daemon_start $W $MIB
SI="env LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH FAIRVGPU_NVML_DEBUG=1"
echo "== nvidia-smi through the stand-in"
$SI nvidia-smi 2>&1 | tee $W/smi.txt
echo "== nvidia-smi -L through the stand-in"
$SI nvidia-smi -L 2>&1
echo "== nvidia-smi -q through the stand-in"
$SI nvidia-smi -q 2>&1 | head -80
echo "== nvidia-smi --query-gpu through the stand-in"
$SI nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,utilization.gpu,driver_version \
    --format=csv,noheader,nounits 2>$W/query.err | tee $W/query.csv; cat $W/query.err
echo "== CUDA through the stand-in"
$SI timeout 60 python3 - > $W/cuda.txt 2>&1 <<'PY'
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
name = ctypes.create_string_buffer(256); cu.cuDeviceGetName(name, 256, dev)
u = (ctypes.c_ubyte * 16)(); cu.cuDeviceGetUuid(u, dev)
bus = ctypes.create_string_buffer(32); cu.cuDeviceGetPCIBusId(bus, 32, dev)
h = bytes(u).hex()
print("name", name.value.decode())
print("uuid", f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
print("bus", bus.value.decode())
PY
cat $W/cuda.txt
echo "== torch through the stand-in (no CUDA_VISIBLE_DEVICES)"
$SI PYTORCH_NVML_BASED_CUDA_CHECK=1 timeout 120 python3 - > $W/torch.txt 2>&1 <<'PY'
import torch
n = torch.cuda.device_count()
print("device_count", n)
if hasattr(torch.cuda, "_raw_device_count_nvml"):
    print("nvml_count", torch.cuda._raw_device_count_nvml())
if hasattr(torch.cuda, "_raw_device_uuid_nvml"):
    print("nvml_uuids", torch.cuda._raw_device_uuid_nvml())
p = torch.cuda.get_device_properties(0)
print("props", p.name, p.total_memory >> 20, "MiB", "uuid", p.uuid)
a = torch.randn(512, 512, device="cuda"); b = torch.randn(512, 512, device="cuda")
err = (a @ b - (a.cpu() @ b.cpu()).cuda()).abs().max().item()
print("matmul_err", err)
try:
    print("utilization", torch.cuda.utilization(0))
except Exception as e:  # needs pynvml, which the machine may lack
    print("utilization unavailable:", type(e).__name__, e)
ok = n == 1 and err < 1e-2
print("torch_ok", int(ok))
PY
cat $W/torch.txt
daemon_stop
echo "== stand-in log lines"; grep -c . $W/logs/daemon.log; tail -5 $W/logs/daemon.log
devices=$(grep -c . $W/query.csv 2>/dev/null || echo 0)
total=$(awk -F', ' 'NR==1{print $5}' $W/query.csv)
smi_uuid=$(awk -F', ' 'NR==1{print $3}' $W/query.csv)
smi_bus=$(awk -F', ' 'NR==1{print $4}' $W/query.csv)
cuda_uuid=$(awk '$1=="uuid"{print $2}' $W/cuda.txt)
cuda_bus=$(awk '$1=="bus"{print $2}' $W/cuda.txt)
uuid_match=0; [ -n "$cuda_uuid" ] && [ "${smi_uuid,,}" = "${cuda_uuid,,}" ] && uuid_match=1
# Compare domain, bus and device as numbers (NVML writes an 8-digit domain).
norm() { local a b c; IFS=':.' read -r a b c _ <<< "$1"; [ -n "$c" ] && echo $((16#$a)):$((16#$b)):$((16#$c)); }
pci_match=0; [ -n "$cuda_bus" ] && [ "$(norm "$smi_bus")" = "$(norm "$cuda_bus")" ] && pci_match=1
torch_ok=$(awk '$1=="torch_ok"{print $2}' $W/torch.txt)
nvml_uuid_torch=$(grep -c "nvml_uuids \['${cuda_uuid#GPU-}'\]\|nvml_uuids \['$cuda_uuid'\]" $W/torch.txt)
echo "torch's NVML UUID list names CUDA's: $nvml_uuid_torch"
echo "== private table slots nvidia-smi called (none expected: the table offers none)"
grep -h "nvmlInternalGetExportTable" $W/smi.txt $W/query.err | sort | uniq -c
host_driver=$(awk -F', ' 'NR==1{print $1}' $W/host.csv)
host_uuid=$(awk -F', ' 'NR==1{print $2}' $W/host.csv)
smi_driver=$(awk -F', ' 'NR==1{print $8}' $W/query.csv)
driver_match=0; [ -n "$host_driver" ] && [ "$smi_driver" = "$host_driver" ] && driver_match=1
own_uuid=0; [ -n "$smi_uuid" ] && [ "${smi_uuid,,}" != "${host_uuid,,}" ] && own_uuid=1
smi_ok=0; grep -q "Driver Version: $host_driver" $W/smi.txt && ! grep -q "Mismatch in versions" $W/smi.txt && smi_ok=1
echo "nvml_devices=$devices nvml_total_mib=${total:-0} uuid_match=$uuid_match pci_match=$pci_match torch_ok=${torch_ok:-0} driver_match=$driver_match own_uuid=$own_uuid smi_ok=$smi_ok"
