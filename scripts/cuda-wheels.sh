#!/usr/bin/env bash
# Unpacks the pieces of NVIDIA's CUDA 13.0 toolkit that PyPI ships and that
# need no GPU (the runtime and its headers, nvcc, NVRTC; with `libraries`
# also cuBLAS, cuFFT, cuRAND, cuSPARSE, cuSOLVER and nvJitLink) into DIR, in the layout nvcc and CMake expect, and
# prints the toolkit's root (DIR/nvidia/cu13). Downloads only once.
# usage: scripts/cuda-wheels.sh DIR [libraries]
set -euo pipefail
dir=$1
wheels="nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88
        nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-cuda-profiler-api==13.0.85
        nvidia-cuda-nvrtc==13.0.88"
[ "${2:-}" = libraries ] && wheels="$wheels nvidia-cublas==13.0.0.19 nvidia-cufft==12.0.0.61
        nvidia-curand==10.4.0.35 nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66
        nvidia-nvjitlink==13.0.88"
mkdir -p "$dir/wheels"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps -d "$dir/wheels" $wheels >&2
for w in "$dir"/wheels/*.whl; do
    stamp="$dir/wheels/.$(basename "$w").unpacked"
    [ -f "$stamp" ] || { python3 -m zipfile -e "$w" "$dir" && touch "$stamp"; }
done
root=$(realpath "$dir/nvidia/cu13")
chmod +x "$root"/bin/* "$root"/nvvm/bin/* 2>/dev/null || true
ln -sfn lib "$root/lib64"
for so in "$root"/lib/*.so.*; do
    b=$(basename "$so")
    ln -sf "$b" "$root/lib/${b%%.so.*}.so"
done
echo "$root"
