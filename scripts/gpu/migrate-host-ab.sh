#!/usr/bin/env bash
# On two GPUs (nvidia-h200-x2), issue 54: builds against each other on
# scripts/gpu/migrate-host-torch.sh, the daemons at debug. ORDER: the
# builds, each a folder under .carry holding fairvgpu, libcuda.so and
# libnvidia_ml.so (default "mhnew mhold mhold mhnew"); I0: the number
# of the first run less one (default 0). Each run's output in
# $OUT/ab-N-BUILD.txt; its pauses, the moves' lines, where each restore's
# time went (the daemons' debug lines) and its last line here. GPU_B=0:
# all three daemons on one GPU.
# usage: [ORDER="a b"] [I0=0] bash scripts/gpu/migrate-host-ab.sh
set -uo pipefail
. scripts/gpu/lib.sh
i=${I0:-0}
for b in ${ORDER:-mhnew mhold mhold mhnew}; do
  i=$((i+1))
  echo "== run $i: $b"
  OUT=/tmp/mh$i DAEMON_LOG=debug R=.carry/$b MT_STEPS=300 bash scripts/gpu/migrate-host-torch.sh > "$OUT/ab-$i-$b.txt" 2>&1
  grep -aE "control: (pause|switch|go)|handed to|serve on|paused|file .* MiB|checkpoint in|^host_migration" "$OUT/ab-$i-$b.txt"
  # Where each restore's time went: B's (live) and C's (from the file).
  for h in b c; do
    grep -ahE "region written|spare worker bound|worker started|served on from a checkpoint|made again|worker serving" \
      /tmp/fvg-mh/logs/daemon-$h.log | sed -E "s/^[^ ]+ +//; s/^/   $h: /" | cut -c1-220
  done
done
