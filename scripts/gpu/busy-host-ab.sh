#!/usr/bin/env bash
# On the GPU machine: builds against each other on a busy host (issue 32).
# BUILDS: directories each holding a built `fairvgpu` (for instance
# .carry/new .carry/old; `.carry/new+--realtime` runs .carry/new's with the
# real-time lift); ROUNDS times (default 2), the order reversed every
# other round, each build's `bench fairness --executor cuda --seconds SECS
# --hogs HOGS` (host CPU lifts on, the bench's default), which measures
# beside the hogs (alone rates beside the same hogs) and then on the quiet
# host. A line per run: the build, the bench's last line, its idle
# releases, the lightest guest's share beside the hogs (fair: 0.167) and
# the holders' waits for late guests (count, mean).
# usage: BUILDS="..." [ROUNDS=2] [SECS=8] [HOGS=12] bash scripts/gpu/busy-host-ab.sh
set -uo pipefail
. scripts/gpu/lib.sh
LOG=$OUT/busy-host-ab.log
{ header; uptime; } | tee -a "$LOG"
alternate_builds "${ROUNDS:-2}" "$LOG" fairness_summary bench fairness --executor cuda \
  --seconds "${SECS:-8}" --hogs "${HOGS:-12}"
uptime | tee -a "$LOG"
