#!/usr/bin/env bash
# On a GPU: PyTorch trains a small transformer (float32, then bf16
# autocast; every step's loss printed) through the stand-in, with a daemon
# on the cuda executor and one VM, vm1; mid-phase, `fairvgpu checkpoint`
# holds its vGPU and writes the checkpoint file, then `fairvgpu resume` lets
# it go on, once per phase. The same training runs natively in the same
# call; the two are compared step by step (scripts/gpu/migrate_torch.py
# compare). What a host-to-host move or a save takes on the device side,
# without QEMU (none on the GPU machines). Carried: the release fairvgpu,
# libcuda.so and libnvidia_ml.so in $R (default .carry/release). MT_STEPS:
# steps per phase (default 300).
# Last line: checkpoint_ok=… losses_same=… hold_ms=… (the longer hold,
# from the checkpoint's ask to the resume's answer) file_mib=… (the larger)
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-ct; rm -rf $W; mkdir -p $W/lib
cp $R/libcuda.so $W/lib/libcuda.so.1
cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so.1
STEPS=${MT_STEPS:-300}
header
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
DAEMON_KEYS=$'[placement]\nenabled = false' VM_KEYS='gpu = 0' daemon_start $W 20480

echo "== native, GPU 0"
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 scripts/gpu/migrate_torch.py $STEPS > $W/logs/native 2>&1
echo "rc=$?"; tail -n 2 $W/logs/native

echo "== through the stand-in, checkpointed and resumed in each phase"
LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 300 python3 scripts/gpu/migrate_torch.py $STEPS $W/progress > $W/logs/standin 2>&1 &
P=$!
taken=0; holds=""; sizes=""
# Checkpoints the vGPU once the run has done step $2 of phase $1, then resumes it.
checkpoint_at() {
    local phase=$1 step=$2 out t0 t1
    wait_progress $phase $step
    echo "-- at $(cat $W/progress 2>/dev/null): fairvgpu checkpoint --vm vm1 --file $phase.fvgpu"
    t0=$(date +%s%N)
    out=$($R/fairvgpu checkpoint --config $W/host.toml --vm vm1 --file $phase.fvgpu 2>&1)
    echo "$out"
    $R/fairvgpu resume --config $W/host.toml --vm vm1 2>&1
    t1=$(date +%s%N)
    if echo "$out" | grep -q "checkpoint in"; then
        taken=$((taken + 1))
        holds="$holds $(( (t1 - t0) / 1000000 ))"
        sizes="$sizes $(( $(stat -c %s $W/run/checkpoints/$phase.fvgpu) >> 20 ))"
    fi
    echo "-- held $(( (t1 - t0) / 1000000 )) ms"
}
checkpoint_at fp32 $((STEPS / 4))
checkpoint_at bf16 $((STEPS / 4))
wait $P; src=$?
echo "rc=$src"; tail -n 2 $W/logs/standin
echo "== the daemon's lines on the checkpoints"
grep -E "checkpoint|held|goes on" $W/logs/daemon.log | tail -n 20
$R/fairvgpu status --config $W/host.toml 2>&1 | grep -iE "event|checkpoint" | tail -n 10
daemon_stop

echo "== step by step"
python3 scripts/gpu/migrate_torch.py compare $W/logs/native $W/logs/standin
same=$?
losses_same=0; [ $same -eq 0 ] && [ $src -eq 0 ] && losses_same=1
checkpoint_ok=0; [ $taken -eq 2 ] && [ $src -eq 0 ] && checkpoint_ok=1
hold=$(echo $holds | tr ' ' '\n' | sort -g | tail -n 1)
size=$(echo $sizes | tr ' ' '\n' | sort -g | tail -n 1)
cp $W/logs/* "$OUT"/ 2>/dev/null
echo "checkpoint_ok=$checkpoint_ok losses_same=$losses_same hold_ms=${hold:-none} file_mib=${size:-none}"
