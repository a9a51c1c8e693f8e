#!/usr/bin/env bash
# On the GPU machine: what handing the GPU from one vGPU to the next costs.
# First scripts/gpu/ctxswitch_probe.c: the GPU's own switch from one context
# to another in a launch+synchronize loop (native CUDA, no fairvgpu). Then
# the three-guest 1:2:3 fairness bench once per time slice, with its
# hand-off figures: grants, idle releases, drain at a slice's end, grant to
# first submission, the service's release-to-grant and the time no guest
# held the GPU. With MPS=1 both run as MPS clients (the probe of a control
# daemon started here, the bench with --mps). Carried: $R/fairvgpu
# (default .carry/release).
# usage: R=.carry/release [SECS=10] [EXECUTOR=cuda] [MPS=1] [TAG=name]
#        [SLICES="6000 12000"] bash scripts/gpu/handoff.sh
# SLICES: time slices (µs) to run the bench at (default: its 6 ms).
# TAG: names this run's files, for several runs in one call.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
SECS=${SECS:-10}
EXECUTOR=${EXECUTOR:-cuda}
T=${TAG:+-$TAG}
LOG=$OUT/handoff$T.log
: > "$LOG"
header | tee -a "$LOG"
MPS_ARGS=()
if [ "${MPS:-0}" = 1 ]; then
  CONTROL=/usr/local/nvidia/bin/nvidia-cuda-mps-control
  MPS_ARGS=(--mps --mps-control "$CONTROL")
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fvg-handoff-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fvg-handoff-mps/log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  $CONTROL -d && echo "== the probe as a client of an MPS control daemon" | tee -a "$LOG"
fi
[ "$EXECUTOR" = cuda ] && probe ctxswitch_probe /tmp/fvg-ctxswitch 2>&1 | tee -a "$LOG"
if [ "${MPS:-0}" = 1 ]; then
  echo quit | timeout 10 $CONTROL
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
summary="handoff"
for us in ${SLICES:-6000}; do
  f=$OUT/handoff$T-$us.log
  echo "== bench fairness --executor $EXECUTOR --seconds $SECS --slice-us $us ${MPS_ARGS[*]}" | tee -a "$LOG"
  RUST_LOG=warn timeout 200 "$R/fairvgpu" bench fairness --executor "$EXECUTOR" \
    --seconds "$SECS" --slice-us "$us" "${MPS_ARGS[@]}" > "$f" 2>&1
  echo "rc=$?" >> "$f"
  grep -avE 'INFO|WARN' "$f" | tee -a "$LOG" | grep -aE '^(guest [0-9]: grants|all:|fairvgpu_mmr|rc=)'
  last=$(grep -a '^fairvgpu_mmr=' "$f" | tail -1)
  val() { grep -o "\b$1=[^ ]*" <<<"$last" | cut -d= -f2; }
  tag=${us}us
  summary="$summary ${tag}_tp=$(val fairvgpu_throughput) ${tag}_mmr=$(val fairvgpu_mmr) ${tag}_gap_us=$(val gap_us) ${tag}_drain_us=$(val drain_us) ${tag}_idle=$(val idle_releases)"
done
echo "$summary" | tee -a "$LOG"
