#!/usr/bin/env bash
# On the GPU machine: the rate of pinned copies by the kind of host memory
# behind them (scripts/gpu/pinned_pages_probe.c), and how the host's
# transparent huge pages for shared memory are set. Needs nvcc only.
set -uo pipefail
. scripts/gpu/lib.sh
echo "shmem_enabled: $(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>&1)"
echo "enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1)"
echo "HugePages_Total: $(awk '/HugePages_Total/{print $2}' /proc/meminfo)"
probe pinned_pages_probe /tmp/fvg-pinned-pages
