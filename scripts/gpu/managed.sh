#!/usr/bin/env bash
# On the GPU machine: managed memory on the device through the stand-in
# (a one-VM daemon on the cuda executor, 8 GiB vGPU).
#   1. tests/c/managed.c with the real kernels of worker/kernels/
#      fairvgpu.ptx: arrays larger than the pinned pool, CPU/GPU hand-offs,
#      a CPU access while kernels are queued, CPU and GPU atomics on one
#      counter, prefetch, advice, the program's own SIGSEGV handler.
#   2. Numba's managed-allocation tests (numba.cuda.tests.cudadrv.
#      test_managed_alloc), natively and through the stand-in.
# Last line: managed_c_ok=0|1 numba_native=N/M numba_standin=N/M
# Carried: the release fairvgpu and libcuda.so (target/release, or
# R=.carry/release); Numba from pip if the machine has none.
# usage: scripts/gpu/managed.sh
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-target/release}
W=/tmp/fvg-managed; rm -rf $W; mkdir -p $W/lib $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
header
cc -O2 -Wall -o $W/managed tests/c/managed.c -L$W/lib -l:libcuda.so.1 -lm || exit 1
python3 -c "import numba.cuda" 2>/dev/null || pip install -q numba-cuda numpy >/dev/null 2>&1

daemon_start $W 8192
echo "== tests/c/managed.c through the stand-in"
LD_LIBRARY_PATH=$W/lib timeout 300 $W/managed worker/kernels/fairvgpu.ptx | tee $W/logs/managed.out
grep -q "managed: all checks passed" $W/logs/managed.out && c_ok=1 || c_ok=0

count() { grep -E "^Ran [0-9]+ test" "$1" | awk '{print $2}'; }
fails() { grep -oE "(failures|errors)=[0-9]+" "$1" | cut -d= -f2 | paste -sd+ | bc 2>/dev/null || echo 0; }
T=numba.cuda.tests.cudadrv.test_managed_alloc
echo "== Numba $T natively"
LD_LIBRARY_PATH=$NV timeout 600 python3 -m unittest -v $T > $W/logs/numba.native 2>&1
tail -5 $W/logs/numba.native
echo "== Numba $T through the stand-in"
NUMBA_CUDA_DRIVER=$W/lib/libcuda.so.1 LD_LIBRARY_PATH=$W/lib timeout 600 \
    python3 -m unittest -v $T > $W/logs/numba.standin 2>&1
grep -E "ok$|FAIL|ERROR|skipped" $W/logs/numba.standin | head -20
tail -5 $W/logs/numba.standin
daemon_stop
nn=$(count $W/logs/numba.native); ns=$(count $W/logs/numba.standin)
fn=$(fails $W/logs/numba.native); fs=$(fails $W/logs/numba.standin)
cp -r $W/logs "$OUT/managed-logs"
echo "managed_c_ok=$c_ok numba_native=$((${nn:-0} - ${fn:-0}))/${nn:-0} numba_standin=$((${ns:-0} - ${fs:-0}))/${ns:-0}"
