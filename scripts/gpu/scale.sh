#!/usr/bin/env bash
# On a machine with four GPUs (issue 51): the density scenarios with this
# build and, in the same call, an earlier one (the A/B of a change to the
# sharing rule); the host side at scale (`bench scale`: 64 VMs over four
# GPUs, then 64 on one GPU); the three guests beside 12 CPU hogs.
# usage: NEW=.carry/new OLD=.carry/old SECS=6 bash scripts/gpu/scale.sh
#   OLD empty: no A/B. PARTS: which of "density scale hogs" (default all);
#   SCALE_GPUS: the GPU counts of the scale runs (default "4 1").
set -uo pipefail
. scripts/gpu/lib.sh
new=${NEW:-.carry/new}/fairvgpu
old=${OLD:+$OLD/fairvgpu}
secs=${SECS:-6}
parts=" ${PARTS:-density scale hogs} "
{
  header
  if [[ $parts == *" density "* ]]; then
    for b in $new $old; do
      echo "== $b bench fairness --executor cuda --seconds $secs --density ${VMS:-8,32}"
      RUST_LOG=warn $b bench fairness --executor cuda --seconds "$secs" --density "${VMS:-8,32}"; echo "rc=$?"
    done
  fi
  if [[ $parts == *" scale "* ]]; then
    for g in ${SCALE_GPUS:-4 1}; do
      echo "== $new bench scale --executor cuda --vms 64 --gpus $g"
      RUST_LOG=warn $new bench scale --executor cuda --vms 64 --gpus "$g" --seconds 5; echo "rc=$?"
    done
  fi
  if [[ $parts == *" hogs "* ]]; then
    for b in $new $old; do
      echo "== $b bench fairness --executor cuda --seconds $secs --hogs 12 --realtime"
      RUST_LOG=warn $b bench fairness --executor cuda --seconds "$secs" --hogs 12 --realtime; echo "rc=$?"
    done
  fi
} 2>&1 | tee "$OUT/scale.log" |
  grep -aE '^(==|density|mix|vms=|hogs=|rc=|fairvgpu_mmr|scale|daemon up|empty|idle|busy|grant services|GPU memory|Error|error|[A-Z].*H[12]00)'
