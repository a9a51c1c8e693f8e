#!/usr/bin/env bash
# On the GPU machine: NVIDIA/cuda-samples' whole Samples/0-6 (packed by
# scripts/gpu/pack-upstream.sh into .carry/upstream.tar.xz), built here with
# nvcc on every core (scripts/gpu/build_upstream.py), then each program run
# natively and through the stand-in by scripts/gpu/conformance.sh (exit
# status, verdict line, wall time both ways). The build is kept in .samples
# for later calls on the same machine (REBUILD=1 to redo it).
# usage: R=.carry/release scripts/gpu/upstream.sh [CATEGORY...]
#   CATEGORY: a Samples folder prefix, e.g. 0 1 2 (default: all)
set -uo pipefail
. scripts/gpu/lib.sh
samples_build || exit 1
names=()
for n in $(ls .samples/bin); do
    cat=$(readlink .samples/bin/$n | sed -n 's|.*/Samples/\([0-9]\)_.*|\1|p')
    if [ $# -eq 0 ] || [[ " $* " == *" $cat "* ]]; then names+=("$n"); fi
done
echo "== ${#names[@]} programs"
MODES= bash scripts/gpu/conformance.sh "${names[@]}"
