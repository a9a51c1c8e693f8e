#!/usr/bin/env bash
# On the GPU machine: the 1:2:3 fairness bench on a busy host (issue 32).
# Alternates the carried build ($R, default .carry/busyhost: `--hogs`) with a
# build before the fix ($BASE, default .carry/bisect/84f611d, beside hogs
# started here since it has no --hogs), ROUNDS times (default 3) each beside
# HOGS busy-loop processes (default 12), and each build of $VARIANTS (default
# .carry/nospin and .carry/lift where carried; builds with --hogs) beside as
# many; then $R on the quiet host, ROUNDS times. First it says what the
# machine allows a process to do for its own threads' CPU (capabilities, a
# negative nice, SCHED_FIFO, a cgroup v2 child).
# A line per run: build, host, MMR, aggregate, guest 0's share and what the
# grant service charged it against its device time.
# usage: [R=.carry/busyhost] [BASE=.carry/bisect/84f611d] [VARIANTS="dir ..."]
#        [ROUNDS=3] [HOGS=12]
#        [SLICE_US=] [SECS=10] [EXECUTOR=cuda] bash scripts/gpu/busy-host.sh
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/busyhost}
BASE=${BASE:-.carry/bisect/84f611d}
ROUNDS=${ROUNDS:-3}
HOGS=${HOGS:-12}
if [ -z "${VARIANTS+x}" ]; then
  VARIANTS=""
  for v in .carry/nospin .carry/lift; do
    [ -x "$v/fairvgpu" ] && VARIANTS="$VARIANTS $v"
  done
fi
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
  if nice -n -5 true 2>/dev/null; then echo "negative nice: allowed"; else echo "negative nice: refused"; fi
  if chrt -f 1 true 2>/dev/null; then echo "SCHED_FIFO: allowed"; else echo "SCHED_FIFO: refused"; fi
  cg=/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup | head -1)
  fs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)
  echo "cgroup $cg: $fs, cpu.weight $(cat "$cg/cpu.weight" 2>/dev/null || echo none)"
  if [ "$fs" = cgroup2fs ] && mkdir "$cg/fvg-probe" 2>/dev/null; then
    echo "cgroup: a child can be made"; rmdir "$cg/fvg-probe"
  else
    echo "cgroup: no child can be made (or no cgroup v2)"
  fi
} 2>&1 | tee -a "$LOG"
# run NAME BUILD HOST [ARGS...]: one bench, its summary line.
run() {
  local name=$1 bin=$2/fairvgpu host=$3; shift 3
  [ -x "$bin" ] || { echo "$name: no $bin" | tee -a "$LOG"; return; }
  echo "== $name, $host: $bin bench fairness --executor $EXECUTOR --seconds $SECS ${EXTRA[*]} $*" >> "$LOG"
  RUST_LOG=warn timeout 100 "$bin" bench fairness --executor "$EXECUTOR" --seconds "$SECS" "${EXTRA[@]}" "$@" > "$OUT/run.txt" 2>&1
  local rc=$?
  cat "$OUT/run.txt" >> "$LOG"
  local share charged
  share=$(grep -a "^fairvgpu  *0 " "$OUT/run.txt" | awk '{print $6}')
  charged=$(grep -a -o "guest 0 [0-9.]* ([0-9.]* of its device time)" "$OUT/run.txt" | grep -o "([0-9.]*" | tr -d '(')
  echo "$name $host rc=$rc $(grep -a -o 'fairvgpu_mmr=[0-9.]*' "$OUT/run.txt") $(grep -a -o 'fairvgpu_throughput=[0-9.]*' "$OUT/run.txt") $(grep -a -o 'idle_releases=[0-9]*' "$OUT/run.txt") guest0_share=$share guest0_charged_vs_device=${charged:--}" | tee -a "$LOG"
}
for round in $(seq "$ROUNDS"); do
  run release "$R" "hogs=$HOGS" --hogs "$HOGS"
  hogs_start "$HOGS" >> "$LOG"
  run base "$BASE" "hogs=$HOGS"
  hogs_stop
  for v in $VARIANTS; do
    run "$(basename "$v")" "$v" "hogs=$HOGS" --hogs "$HOGS"
  done
done
for round in $(seq "$ROUNDS"); do
  run release "$R" quiet
done
rm -f "$OUT/run.txt"
uptime | tee -a "$LOG"
