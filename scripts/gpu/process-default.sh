#!/usr/bin/env bash
# On a machine with two GPUs: a VM's processes in the daemon's default
# configuration (a worker per guest process), issue 52's sequence:
#  1. scripts/gpu/faults.sh: a checked neighbour while other
#     processes of its VM assert, read an illegal address and trap; the next
#     process after each; printf; a cross-process read;
#  2. scripts/gpu/ipc.sh: memory and event handles between two processes;
#  3. pinned memory: two processes of one VM take 5/8 and 1/4 of the pool at
#     once (tests/c/faults.c's pinned mode);
#  4. scripts/gpu/migrate-torch.sh with a checked neighbour in the VM: every
#     worker moves, GPU 0 -> 1 -> 0;
#  5. idle cost: 4 idle VMs, what the daemon's processes hold on the GPUs,
#     against a native process's idle context.
# Carried: fairvgpu, libcuda.so, libnvidia_ml.so in $R. Last line:
#   next_process_failures=… next_process_ms=… neighbour_errors=… cross_process_reads=…
#   printf_lines=N/N host_log_guest_lines=… ipc_ok=… pinned_ok=… migrate_ok=…
#   idle_gpu_mib_per_vm=… native_idle_gpu_mib=…
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
export R
header
echo "=== 1. faults"
bash scripts/gpu/faults.sh 2>&1 | tee $OUT/faults.log | grep -vaE '^stderr: ' | tail -40
f=$(tail -1 $OUT/faults.log)
get() { echo "$2" | grep -o "$1=[^ ]*" | cut -d= -f2; }

echo "=== 2. IPC"
bash scripts/gpu/ipc.sh > $OUT/ipc.log 2>&1
grep -aE '^(==|ok|FAILED|ipc_)|rc=' $OUT/ipc.log | tail -40
i=$(tail -1 $OUT/ipc.log)
# Every check passes through the stand-in (natively, one about a destroyed
# event's handle fails: the driver still opens it).
ipc_ok=0
[ "$(get ipc_standin_failed "$i")" = 0 ] && [ "$(get ipc_standin_ok "$i")" -ge "$(get ipc_native_ok "$i")" ] && ipc_ok=1

echo "=== 3. pinned memory shared on demand"
W=/tmp/fvg-pinned; rm -rf $W; mkdir -p $W/lib
cp $R/libcuda.so $W/lib/libcuda.so.1; ln -sf libcuda.so.1 $W/lib/libcuda.so
gcc -O2 -Itests/c -o $W/faults tests/c/faults.c -L$W/lib -lcuda
daemon_start $W 8192
SI="env LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH"
$SI $W/faults worker/kernels/faults.ptx pinned 160 4 > $W/a.out 2>&1 & A=$!
sleep 0.5
$SI $W/faults worker/kernels/faults.ptx pinned 64 4 > $W/b.out 2>&1; b=$?
wait $A; a=$?
cat $W/a.out $W/b.out
daemon_stop
pinned_ok=0; [ $a = 0 ] && [ $b = 0 ] && grep -qx "pinned: OK at 0x[0-9a-f]*" $W/a.out && grep -qx "pinned: OK at 0x[0-9a-f]*" $W/b.out && pinned_ok=1

echo "=== 4. migration of every worker, a PyTorch training and a checked neighbour"
MT_STEPS=150 MT_NEIGHBOUR=30 bash scripts/gpu/migrate-torch.sh > $OUT/migrate.log 2>&1
grep -aE '^(==|--|rc=|migrate_ok|values=|loop:)|pause_us|registered' $OUT/migrate.log | tail -30
m=$(tail -1 $OUT/migrate.log)
migrate_ok=0
[ "$(get migrate_ok "$m")" = 1 ] && [ "$(get losses_same "$m")" = 1 ] && [ "$(get neighbour_errors "$m")" = 0 ] && migrate_ok=1

echo "=== 5. idle cost"
W=/tmp/fvg-idle; rm -rf $W; mkdir -p $W/run $W/logs
{
    echo "[daemon]"; echo "run_dir = \"$W/run\""; echo 'executor = "cuda"'
    for v in 1 2 3 4; do printf '[[vm]]\nname = "vm%s"\ntenant = "t"\nmemory_limit_mib = 8192\n' $v; done
} > $W/host.toml
RUST_LOG=info $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log & D=$!
sleep 15
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tee $W/apps
pgrep -af 'fairvgpu worker' | cut -c1-160
total=$(awk -F', ' '{s += $2} END {print s + 0}' $W/apps)
kill $D; wait $D 2>/dev/null
ngpu=$(nvidia-smi -L | wc -l)
# What is left once a spare per GPU is counted: the VMs' own.
spare=$(awk -F', ' 'NR == 1 {print $2 + 0}' $W/apps)
per_vm=$(awk -v t=$total -v s=${spare:-0} -v g=$ngpu 'BEGIN { v = (t - s * g) / 4; if (v < 0) v = 0; printf "%.0f", v }')
echo "daemon's processes on the GPUs: $total MiB over $ngpu GPUs; a spare ${spare:-0} MiB"
python3 - <<'PY' > $W/native 2>&1 &
import ctypes, time
cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cu.cuCtxSetCurrent(ctx); print("context", flush=True); time.sleep(6)
PY
N=$!; sleep 4
native=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$N '$1 == p {print $2}')
wait $N
echo "a native idle context: ${native:-missing} MiB"

echo "next_process_failures=$([ "$(get next_process_ok "$f")" = 1 ] && echo 0 || echo 1) next_process_ms=$(get next_process_ms "$f") neighbour_errors=$(get neighbour_errors "$f") cross_process_reads=$(get cross_process_reads "$f") printf_lines=$(get printf_lines "$f") host_log_guest_lines=$(get host_log_guest_lines "$f") ipc_ok=$ipc_ok pinned_ok=$pinned_ok migrate_ok=$migrate_ok idle_gpu_mib_per_vm=$per_vm native_idle_gpu_mib=${native:-missing}"
