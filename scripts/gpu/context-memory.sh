#!/usr/bin/env bash
# On the GPU machine: what a worker's registration context costs in GPU
# memory and what smaller limits give back (scripts/gpu/context_memory_probe.c).
set -uo pipefail
. scripts/gpu/lib.sh
probe context_memory_probe /tmp/fvg-context-memory
