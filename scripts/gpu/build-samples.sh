#!/usr/bin/env bash
# Builds the cuda-samples programs of ../shared/cuda-samples with CMake and
# nvcc 13.0 on a machine without a GPU (NVIDIA's pip wheels give the
# toolkit), for the H100 (sm_90), into .samples/ (ignored by git), ready to
# carry to the GPU machine for scripts/gpu/conformance.sh.
#
# usage: scripts/gpu/build-samples.sh [SAMPLES_DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
src=${1:-../shared/cuda-samples}
out=.samples
mkdir -p .git/info; grep -qx '/.samples/' .git/info/exclude 2>/dev/null || echo '/.samples/' >> .git/info/exclude
command -v cmake >/dev/null || apt-get install -y -q cmake >/dev/null || exit 1
tk=$(scripts/cuda-wheels.sh "$out/x" libraries) || exit 1
# Programs link against libcuda.so; any library of that name does (the
# stand-in, built here).
cargo build --release -q -p libcuda || exit 1
mkdir -p "$tk/lib/stubs"; cp target/release/libcuda.so "$tk/lib/stubs/libcuda.so"
export PATH="$tk/bin:$PATH"

rm -rf "$out/src" "$out/build" "$out/bin"
cp -r "$src" "$out/src"
# Built for the GPU that runs them (sm_90), as upstream's list would take
# nine times as long on this machine.
find "$out/src/Samples" -name CMakeLists.txt -exec \
    sed -i 's/set(CMAKE_CUDA_ARCHITECTURES [0-9 ]*)/set(CMAKE_CUDA_ARCHITECTURES 90)/' {} +
mkdir -p "$out/bin" "$out/build"
built=0 failed=0
for dir in "$out"/src/Samples/*/*/; do
    name=$(basename "$dir")
    b="$out/build/$name"
    if cmake -S "$dir" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$tk" \
            -DCMAKE_CUDA_COMPILER="$tk/bin/nvcc" >"$b.log" 2>&1 &&
        cmake --build "$b" -j2 >>"$b.log" 2>&1; then
        mkdir -p "$out/bin/$name"
        # The program and what it reads at run time (fatbins, kernel sources).
        find "$b" -maxdepth 1 -type f \( -perm -u+x -o -name '*.fatbin' -o -name '*.ptx' \) \
            -exec cp {} "$out/bin/$name/" \;
        cp "$dir"/*.cu "$dir"/*.cuh "$out/bin/$name/" 2>/dev/null
        built=$((built + 1)); echo "built $name"
    else
        failed=$((failed + 1)); echo "FAILED $name (see $b.log)"
    fi
done
echo "samples built=$built failed=$failed"
