#!/usr/bin/env bash
# On the GPU machine: the three-guest 1:2:3 fairness bench once per
# hand-off setting (FAIRVGPU_HANDOFF, see host-backend/src/worker/handoff.rs),
# back to back, with each run's hand-off figures: grants, idle releases,
# drain at a slice's end, grant to first submission, the service's
# release-to-grant and the time no guest held the GPU. Carried:
# $R/fairvgpu (default .carry/release).
# First, scripts/gpu/ctxswitch_probe.c: what the GPU's switch from one
# context to another costs a launch+synchronize loop. With MPS=1 the probe
# and the bench run as clients of an MPS control daemon started for them
# (their contexts then share the server's: no switch).
# usage: R=.carry/release [SECS=10] [VARIANTS="base slack spin-drain slack,spin-drain"]
#        [EXECUTOR=cuda] [MPS=1] [TAG=name] [SLICES="6000 12000"] bash scripts/gpu/handoff.sh
# SLICES: time slices (µs) to run each setting at (default: the bench's 6 ms).
# TAG: names this run's files, for several runs in one call.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
SECS=${SECS:-10}
EXECUTOR=${EXECUTOR:-cuda}
VARIANTS=${VARIANTS:-base slack spin-drain slack,spin-drain}
T=${TAG:+-$TAG}
LOG=$OUT/handoff$T.log
: > "$LOG"
header | tee -a "$LOG"
if [ "${MPS:-0}" = 1 ]; then
  export PATH=/usr/local/nvidia/bin:$PATH
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/fvg-handoff-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/fvg-handoff-mps/log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && echo "== as clients of an MPS control daemon" | tee -a "$LOG"
fi
[ "$EXECUTOR" = cuda ] && probe ctxswitch_probe /tmp/fvg-ctxswitch 2>&1 | tee -a "$LOG"
summary="handoff"
for us in ${SLICES:-6000}; do
for v in $VARIANTS; do
  echo "== FAIRVGPU_HANDOFF=$v bench fairness --executor $EXECUTOR --seconds $SECS --slice-us $us" | tee -a "$LOG"
  FAIRVGPU_HANDOFF=$v RUST_LOG=warn timeout 200 "$R/fairvgpu" bench fairness --executor "$EXECUTOR" \
    --seconds "$SECS" --slice-us "$us" > "$OUT/handoff$T-$v.log" 2>&1
  echo "rc=$?" >> "$OUT/handoff$T-$v.log"
  grep -avE 'INFO|WARN' "$OUT/handoff$T-$v.log" | tee -a "$LOG" | grep -aE '^(guest [0-9]: grants|all:|fairvgpu_mmr|rc=)'
  last=$(grep -a '^fairvgpu_mmr=' "$OUT/handoff$T-$v.log" | tail -1)
  val() { grep -o "\b$1=[^ ]*" <<<"$last" | cut -d= -f2; }
  tag=${v//,/+}_${us}us
  summary="$summary ${tag}_tp=$(val fairvgpu_throughput) ${tag}_mmr=$(val fairvgpu_mmr) ${tag}_gap_us=$(val gap_us) ${tag}_drain_us=$(val drain_us) ${tag}_idle=$(val idle_releases)"
done
done
[ "${MPS:-0}" = 1 ] && { echo quit | timeout 10 nvidia-cuda-mps-control; }
echo "$summary" | tee -a "$LOG"
