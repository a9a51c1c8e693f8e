#!/usr/bin/env bash
# On the GPU machine: the same driver-API programs natively and through the
# stand-in (daemon on the cuda executor). Carried: target/release/fairvgpu,
# target/release/libcuda.so, target/release/cudarc-guest.
set -uo pipefail
. scripts/gpu/lib.sh
W=/tmp/fvg; rm -rf $W; mkdir -p $W/lib $W/run
cp target/release/libcuda.so $W/lib/libcuda.so.1; cp target/release/libcuda.so $W/lib/libcuda.so
PTX=$PWD/worker/kernels/fairvgpu.ptx
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
header
nvcc --version | tail -2
echo "== build the C program with nvcc for sm_90"
nvcc -O2 -arch=sm_90 -x c -o $W/driver_api tests/c/driver_api.c -L$NV -lcuda -lm && echo built
echo "== native (real libcuda)"
$W/driver_api $PTX rate | tee $W/native.txt; echo "rc=$?"
RUST_LOG=warn ./target/release/fairvgpu serve --config $W/host.toml &
D=$!
for i in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
echo "== through the stand-in (fairvgpu libcuda.so.1 -> ring -> worker -> GPU)"
FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib $W/driver_api $PTX rate | tee $W/standin.txt; echo "rc=$?"
echo "== fork mode (a child forked mid-program exits at once; the parent goes on): native, then through the stand-in"
$W/driver_api $PTX fork | grep -E "^fork:|all checks"; echo "rc=$?"
FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib $W/driver_api $PTX fork | grep -E "^fork:|all checks"; echo "rc=$?"
# Sustained: 200,000 launches, the ring full after the first ones; bursts:
# 128 launches between synchronizes, only the launch calls timed.
sus() { sed -n 's/^launches=.* enqueue_per_s=\([0-9]*\).*/\1/p' "$1"; }
bur() { sed -n 's/^bursts=.* burst_enqueue_per_s=\([0-9]*\).*/\1/p' "$1"; }
awk -v s="$(sus $W/standin.txt)" -v n="$(sus $W/native.txt)" \
    -v bs="$(bur $W/standin.txt)" -v bn="$(bur $W/native.txt)" \
    'BEGIN { if (n > 0 && bn > 0) printf "launch_rate_ratio=%.3f burst_launch_rate_ratio=%.3f\n", s / n, bs / bn; else print "launch_rate_ratio=missing" }'
cat > $W/nb.py <<'PY'
import numpy as np
np.row_stack = np.vstack
from numba import cuda, float32

@cuda.jit
def add(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]

@cuda.jit
def total(x, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, 0, x[i])

TPB = 16
@cuda.jit
def matmul(A, B, C):
    sA = cuda.shared.array((TPB, TPB), float32)
    sB = cuda.shared.array((TPB, TPB), float32)
    x, y = cuda.grid(2)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0.)
    for k in range(A.shape[1] // TPB):
        sA[ty, tx] = A[y, tx + k * TPB]
        sB[ty, tx] = B[ty + k * TPB, x]
        cuda.syncthreads()
        for j in range(TPB):
            acc += sA[ty, j] * sB[j, tx]
        cuda.syncthreads()
    C[y, x] = acc

rng = np.random.default_rng(7)
n = 1 << 20
a = rng.random(n, dtype=np.float32); b = rng.random(n, dtype=np.float32)
c = cuda.device_array_like(a)
add[(n + 255) // 256, 256](cuda.to_device(a), cuda.to_device(b), c)
assert (c.copy_to_host() == a + b).all()
print("numba vector add ok")

xi = rng.integers(0, 1000, n).astype(np.int64)
out = cuda.to_device(np.zeros(1, dtype=np.int64))
total[(n + 255) // 256, 256](cuda.to_device(xi), out)
assert out.copy_to_host()[0] == xi.sum()
print("numba reduction ok", int(xi.sum()))

m = 256
A = rng.random((m, m), dtype=np.float32); B = rng.random((m, m), dtype=np.float32)
dC = cuda.device_array((m, m), dtype=np.float32)
matmul[(m // TPB, m // TPB), (TPB, TPB)](cuda.to_device(A), cuda.to_device(B), dC)
ref = A.astype(np.float64) @ B.astype(np.float64)
err = np.linalg.norm(dC.copy_to_host() - ref) / np.linalg.norm(ref)
assert err < 1e-5, err
print("numba matmul ok, relative error %.2e" % err)
PY
echo "== Rust program using cudarc (target/release/cudarc-guest)"
echo "-- native"; ./target/release/cudarc-guest $PTX; echo "rc=$?"
echo "-- stand-in"; FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib ./target/release/cudarc-guest $PTX; echo "rc=$?"
echo "== numba-cuda through the stand-in (numba-cuda loads libcuda.so.1 from the library path)"
python3 -c "import numba; print('numba', numba.__version__)" 2>&1 | tail -1
echo "-- native"
timeout 120 python3 $W/nb.py 2>&1 | tail -3; echo "rc=$?"
echo "-- stand-in"
LD_LIBRARY_PATH=$W/lib FAIRVGPU_SOCKET=$W/run/vm1.sock timeout 120 python3 $W/nb.py > $W/nb.log 2>&1; echo "rc=$?"; grep "fairvgpu libcuda" $W/nb.log; tail -4 $W/nb.log
echo "-- control: stand-in on the path, no vGPU: must fail at cuInit"
LD_LIBRARY_PATH=$W/lib FAIRVGPU_SOCKET=/nonexistent timeout 120 python3 $W/nb.py 2>&1 | tail -1; echo "rc=$?"
kill $D; wait $D
} 2>&1 | tee "$OUT/libcuda.log"
