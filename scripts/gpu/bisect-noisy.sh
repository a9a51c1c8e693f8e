#!/usr/bin/env bash
# On the GPU machine: which build made the 1:2:3 fairness bench's shares
# fragile beside busy CPUs (results/2026-11-25-h100-preemptive-slice.md:
# MMR 0.988-0.994 with 9e2f207, 0.82-0.85 with 84f611d, 12 hogs).
# BUILDS: directories each holding a built `fairvgpu`, oldest first
# (default: .carry/old, then .carry/bisect/<commit> in the order of
# .carry/bisect/ORDER, then .carry/release). Every build runs at a 6 ms base
# slice (builds that take --slice-us are given 6000), ROUNDS times (default
# 1), beside HOGS busy-loop processes (default 12). A line per run: the
# build, its MMR and aggregate, and the lightest guest's share (fair: 0.167).
# SECS (default 10) and EXECUTOR (default cuda): the bench's, for a dry run
# of the builds on the sim elsewhere.
set -uo pipefail
. scripts/gpu/lib.sh
if [ -z "${BUILDS:-}" ]; then
  BUILDS=".carry/old"
  if [ -f .carry/bisect/ORDER ]; then
    for c in $(cat .carry/bisect/ORDER); do BUILDS="$BUILDS .carry/bisect/$c"; done
  fi
  BUILDS="$BUILDS .carry/release"
fi
LOG=$OUT/bisect-noisy.log
{ header; uptime; } | tee -a "$LOG"
hogs_start "${HOGS:-12}" >> "$LOG"
for round in $(seq "${ROUNDS:-1}"); do
  for b in $BUILDS; do
    [ -x "$b/fairvgpu" ] || { echo "$b: no fairvgpu" | tee -a "$LOG"; continue; }
    args=(bench fairness --executor "${EXECUTOR:-cuda}" --seconds "${SECS:-10}")
    if "$b/fairvgpu" bench fairness --help 2>/dev/null | grep -q -- --slice-us; then
      args+=(--slice-us 6000)
    fi
    echo "== round $round: $b/fairvgpu ${args[*]}" >> "$LOG"
    RUST_LOG=warn timeout 100 "$b/fairvgpu" "${args[@]}" > "$OUT/run.txt" 2>&1
    rc=$?
    cat "$OUT/run.txt" >> "$LOG"
    share=$(grep -a "^fairvgpu  *0 " "$OUT/run.txt" | awk '{print $6}')
    echo "$b rc=$rc $(grep -a -o 'fairvgpu_mmr=[0-9.]*' "$OUT/run.txt") $(grep -a -o 'fairvgpu_throughput=[0-9.]*' "$OUT/run.txt") lightest_share=$share" | tee -a "$LOG"
  done
done
hogs_stop
rm -f "$OUT/run.txt"
uptime | tee -a "$LOG"
