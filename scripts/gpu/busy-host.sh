#!/usr/bin/env bash
# On the GPU machine: the 1:2:3 fairness bench on a busy host (issue 32),
# with the host CPU options' lifts on and off. Build $R (default
# .carry/cosched: a release `fairvgpu` of a tree with `--lift`), ROUNDS times
# (default 3): `bench fairness --hogs $HOGS --lift on`, then `--lift off`
# (the order swapped every other round, so that neither always runs first).
# Each run measures beside HOGS busy-loop processes (default 12) and then,
# the hogs ended, on the quiet host; its last line is
# `hogs=N fairvgpu_mmr=… fairvgpu_throughput=… quiet_mmr=… quiet_throughput=…`.
# First it says what the machine allows a process to do for its own
# threads' CPU (capabilities, a negative nice, a cgroup v2 child).
# A line per run: the lift, the host CPU options the bench found on, the
# last line's figures, idle releases and guest 0's share beside the hogs.
# Each run takes about 2 x 3.5 x SECS s (about 75 s at SECS=10 on an H100).
# usage: [R=.carry/cosched] [ROUNDS=3] [HOGS=12] [LIFTS="on off"]
#        [SLICE_US=] [SECS=10] [EXECUTOR=cuda] bash scripts/gpu/busy-host.sh
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/cosched}
ROUNDS=${ROUNDS:-3}
HOGS=${HOGS:-12}
LIFTS=${LIFTS:-on off}
SECS=${SECS:-10}
EXECUTOR=${EXECUTOR:-cuda}
EXTRA=()
[ -n "${SLICE_US:-}" ] && EXTRA=(--slice-us "$SLICE_US")
LOG=$OUT/busy-host.log
: > "$LOG"
{ header; uptime; } | tee -a "$LOG"
{
  echo "== what this machine allows"
  grep -E '^Cap(Prm|Eff)' /proc/self/status
  if nice -n -10 true 2>/dev/null; then echo "nice -10: allowed"; else echo "nice -10: refused"; fi
  cg=/sys/fs/cgroup$(grep '^0::' /proc/self/cgroup | cut -d: -f3)
  fs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)
  echo "cgroup $cg: $fs, controllers: $(cat "$cg/cgroup.controllers" 2>/dev/null || echo none)"
} 2>&1 | tee -a "$LOG"
# run LIFT: one bench, its summary line.
run() {
  local lift=$1 bin=$R/fairvgpu
  [ -x "$bin" ] || { echo "no $bin" | tee -a "$LOG"; return; }
  echo "== lift $lift: $bin bench fairness --executor $EXECUTOR --seconds $SECS ${EXTRA[*]} --hogs $HOGS --lift $lift" >> "$LOG"
  RUST_LOG=warn timeout 300 "$bin" bench fairness --executor "$EXECUTOR" --seconds "$SECS" \
    "${EXTRA[@]}" --hogs "$HOGS" --lift "$lift" > "$OUT/run.txt" 2>&1
  local rc=$?
  cat "$OUT/run.txt" >> "$LOG"
  local on
  on=$(grep -a -E '^  (priority|vCPU) lift: on' "$OUT/run.txt" | awk '{print $1}' | paste -sd, -)
  echo "lift=$lift rc=$rc on=${on:-none} $(fairness_summary "$OUT/run.txt")" | tee -a "$LOG"
}
for round in $(seq "$ROUNDS"); do
  order=$LIFTS
  [ $((round % 2)) -eq 0 ] && order=$(echo "$LIFTS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for lift in $order; do run "$lift"; done
done
rm -f "$OUT/run.txt"
uptime | tee -a "$LOG"
