#!/usr/bin/env bash
# On the GPU machine (issue 51): builds against each other on the density
# and mix scenarios and the three guests. BUILDS: directories each holding
# a built `fairvgpu`; ROUNDS times (default 1), the order reversed every
# other round, each build's `bench fairness --executor cuda --seconds SECS
# --density VMS`. A block per run: the build, its density and mix lines
# and its last line.
# usage: BUILDS="..." [ROUNDS=1] [SECS=5] [VMS=8,32] bash scripts/gpu/density-ab.sh
set -uo pipefail
. scripts/gpu/lib.sh
LOG=$OUT/density-ab.log
density_summary() {
  echo
  grep -aE '^(density vms|mix |fairvgpu: MMR)' "$1" | sed 's/^/  /'
  echo "  $(tail -1 "$1")"
}
{ header; uptime; } | tee -a "$LOG"
alternate_builds "${ROUNDS:-1}" "$LOG" density_summary bench fairness --executor cuda \
  --seconds "${SECS:-5}" --density "${VMS:-8,32}"
