#!/usr/bin/env bash
# On a machine with two GPUs (nvidia-h100-x2 / nvidia-h200-x2): PyTorch
# trains a small transformer (float32, then bf16 autocast; every step's loss
# printed) through the stand-in, with a daemon on the cuda executor and one
# VM, vm1, on GPU 0; `fairvgpu migrate --vm vm1 --gpu 1` moves its vGPU in
# the float32 phase and `--gpu 0` moves it back in the bf16 phase, through
# the control API, while it trains. The same training runs natively on GPU 0
# in the same call; the two are compared step by step
# (scripts/gpu/migrate_torch.py compare). Carried: the release fairvgpu and
# libcuda.so in $R (default .carry/release). MT_STEPS: steps per phase
# (default 400). MT_NEIGHBOUR=SECONDS: a second process of the VM (tests/c/faults.c's
# checked loop) computes for SECONDS from the training's start, moved with the training (its errors
# counted: neighbour_errors=…).
# Last line: migrate_ok=… losses_same=… pause_ms=… (the longer pause).
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-mt; rm -rf $W; mkdir -p $W/lib $W/run $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
# The NVML stand-in beside it: on a host of two GPUs PyTorch otherwise
# counts the host's NVML devices against the one vGPU and fails to start.
cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so.1
STEPS=${MT_STEPS:-400}
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[placement]
enabled = false
[[vm]]
name = "vm1"
tenant = "t"
gpu = 0
memory_limit_mib = 20480
TOML
header
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
RUST_LOG=info $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log &
D=$!
for _ in $(seq 200); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done

echo "== native, GPU 0"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 scripts/gpu/migrate_torch.py $STEPS > $W/logs/native 2>&1
echo "rc=$?"; tail -n 2 $W/logs/native

echo "== through the stand-in, moved GPU 0 -> 1 (fp32) -> 0 (bf16)"
FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH \
    timeout 300 python3 scripts/gpu/migrate_torch.py $STEPS $W/progress > $W/logs/standin 2>&1 &
P=$!
if [ -n "${MT_NEIGHBOUR:-}" ]; then
    gcc -O2 -Itests/c -o $W/faults tests/c/faults.c -L$W/lib -lcuda 2>/dev/null ||
        { ln -sf libcuda.so.1 $W/lib/libcuda.so; gcc -O2 -Itests/c -o $W/faults tests/c/faults.c -L$W/lib -lcuda; }
    FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH \
        $W/faults worker/kernels/faults.ptx loop $MT_NEIGHBOUR > $W/logs/neighbour 2>&1 &
    NB=$!
fi
moves=0; pauses=""
# Moves the vGPU to GPU $2 once the run has done step $3 of phase $1.
move_at() {
    local phase=$1 gpu=$2 step=$3 out
    wait_progress $phase $step
    echo "-- at $(cat $W/progress 2>/dev/null): fairvgpu migrate --vm vm1 --gpu $gpu"
    out=$($R/fairvgpu migrate --config $W/host.toml --vm vm1 --gpu $gpu 2>&1)
    echo "$out"
    if echo "$out" | grep -q "on GPU $gpu "; then
        moves=$((moves + 1))
        pauses="$pauses $(echo "$out" | sed -n 's/.*paused \([0-9.]*\) ms.*/\1/p')"
    fi
}
move_at fp32 1 $((STEPS / 4))
# What the vGPU's worker processes still hold on the GPU they left (issue
# 50: a context stayed there), once the old context's teardown is done.
sleep 1
gpu0=$(nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader | awk -F', ' '$1 == 0 {print $2}')
workers=$(pgrep -d'|' -f 'fairvgpu worker' || true)
nvidia-smi --query-compute-apps=gpu_bus_id,pid,used_memory --format=csv,noheader,nounits | tee $W/logs/apps-after-move
old_gpu_mib=$(awk -F', ' -v bus="$gpu0" -v w="^($workers)$" '$1 == bus && $2 ~ w {s += $3} END {print s + 0}' $W/logs/apps-after-move)
echo "-- GPU 0 is $gpu0; the vGPU's workers: ${workers:-none}"
echo "-- worker memory left on GPU 0 after the move: ${old_gpu_mib} MiB"
move_at bf16 0 $((STEPS / 4))
wait $P; src=$?
echo "rc=$src"; tail -n 2 $W/logs/standin
nb=""
if [ -n "${NB:-}" ]; then
    wait $NB
    tail -n 3 $W/logs/neighbour
    nb=" neighbour_errors=$(grep -o 'loop: [0-9]* rounds, [0-9]* errors' $W/logs/neighbour | sed 's/.*, \([0-9]*\) errors/\1/')"
    [ "$nb" = " neighbour_errors=" ] && nb=" neighbour_errors=missing"
fi
echo "== the daemon's lines on the moves"
grep -E "migrat|stays on|refused|registered again" $W/logs/daemon.log | tail -n 20
$R/fairvgpu status --config $W/host.toml 2>&1 | head -n 20
kill $D; wait $D 2>/dev/null

echo "== step by step"
python3 scripts/gpu/migrate_torch.py compare $W/logs/native $W/logs/standin
same=$?
grep -c _loss_ $W/logs/native | sed 's/^/native steps: /'
grep -c _loss_ $W/logs/standin | sed 's/^/stand-in steps: /'
losses_same=0; [ $same -eq 0 ] && [ $src -eq 0 ] && losses_same=1
migrate_ok=0; [ $moves -eq 2 ] && [ $src -eq 0 ] && migrate_ok=1
pause=$(echo $pauses | tr ' ' '\n' | sort -g | tail -n 1)
cp $W/logs/* "$OUT"/ 2>/dev/null
echo "migrate_ok=$migrate_ok losses_same=$losses_same pause_ms=${pause:-none} old_gpu_mib=${old_gpu_mib:-none}$nb"
