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
alternate_builds "${ROUNDS:-3}" "$LOG" last_line bench overhead --executor cuda
