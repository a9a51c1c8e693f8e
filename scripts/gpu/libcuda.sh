#!/usr/bin/env bash
# On the GPU machine: the same driver-API programs natively and through the
# stand-in (daemon on the cuda executor). Carried: target/release/fairvgpu,
# target/release/libcuda.so.
set -uo pipefail
NV=/usr/local/nvidia/lib64
export LD_LIBRARY_PATH=$NV
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/fvg; rm -rf $W; mkdir -p $W/lib $W/run
cp target/release/libcuda.so $W/lib/libcuda.so.1; cp target/release/libcuda.so $W/lib/libcuda.so
PTX=$PWD/host-backend/kernels/fairvgpu.ptx
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 8192
TOML
{
echo "== date: $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc --version | tail -2
echo "== build the C program with nvcc for sm_90"
nvcc -O2 -arch=sm_90 -x c -o $W/driver_api tests/c/driver_api.c -L$NV -lcuda -lm && echo built
echo "== native (real libcuda)"
$W/driver_api $PTX rate; echo "rc=$?"
RUST_LOG=warn ./target/release/fairvgpu serve --config $W/host.toml &
D=$!
for i in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
echo "== through the stand-in (fairvgpu libcuda.so.1 -> ring -> worker -> GPU)"
FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib $W/driver_api $PTX rate; echo "rc=$?"
cat > $W/nb.py <<'PY'
import numpy as np
np.row_stack = np.vstack
from numba import cuda
@cuda.jit
def add(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]
n = 1 << 20
a = np.arange(n, dtype=np.float32); b = 2 * a
c = cuda.device_array_like(a)
add[(n + 255) // 256, 256](cuda.to_device(a), cuda.to_device(b), c)
assert (c.copy_to_host() == a + b).all()
print("numba vector add ok")
PY
echo "== numba-cuda through the stand-in (numba-cuda loads libcuda.so.1 from the library path)"
python3 -c "import numba; print('numba', numba.__version__)" 2>&1 | tail -1
echo "-- native"
timeout 120 python3 $W/nb.py 2>&1 | tail -3; echo "rc=$?"
echo "-- stand-in"
LD_LIBRARY_PATH=$W/lib FAIRVGPU_SOCKET=$W/run/vm1.sock timeout 120 python3 $W/nb.py 2>&1 | tail -25; echo "rc=$?"
kill $D; wait $D
} 2>&1 | tee "$OUT/libcuda.log"
