#!/usr/bin/env bash
# On the GPU machine: a guest's copy out of a DMA target, memcpy against
# non-temporal stores (scripts/gpu/copy_probe.c). Needs nvcc only.
set -uo pipefail
. scripts/gpu/lib.sh
probe copy_probe /tmp/fvg-copy
