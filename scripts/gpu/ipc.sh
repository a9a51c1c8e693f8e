#!/usr/bin/env bash
# On the GPU machine: which memory one context of a process can reach that
# another context of the same process allocated (scripts/gpu/ipc_probe.c),
# natively: what IPC handles between a VM's guest processes, which are
# contexts of one worker, can be built on.
set -uo pipefail
. scripts/gpu/lib.sh
probe ipc_probe /tmp/fvg-ipc 2>&1 | tee "$OUT/ipc.log"
