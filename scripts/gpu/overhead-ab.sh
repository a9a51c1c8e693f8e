#!/usr/bin/env bash
# On the GPU machine: `bench overhead --executor cuda` of builds against
# each other, alternated (issue 33: copies at the link's rate, the
# round trip of a synchronous call). BUILDS: directories each holding a
# built `fairvgpu`; ROUNDS times (default 3), the order reversed every other
# round. Each run's copy table and last line go to the log; a line per run
# names the build and its last line.
# usage: BUILDS="..." [ROUNDS=3] bash scripts/gpu/overhead-ab.sh
set -uo pipefail
. scripts/gpu/lib.sh
LOG=$OUT/overhead-ab.log
header | tee -a "$LOG"
for round in $(seq "${ROUNDS:-3}"); do
  order=$BUILDS
  [ $((round % 2)) -eq 0 ] && order=$(echo "$BUILDS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for b in $order; do
    echo "== round $round: $b/fairvgpu bench overhead --executor cuda" >> "$LOG"
    RUST_LOG=warn timeout 300 "$b/fairvgpu" bench overhead --executor cuda > "$OUT/run.txt" 2>&1
    rc=$?
    cat "$OUT/run.txt" >> "$LOG"
    echo "$b rc=$rc $(tail -1 "$OUT/run.txt")" | tee -a "$LOG"
  done
done
rm -f "$OUT/run.txt"
