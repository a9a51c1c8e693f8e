#!/usr/bin/env bash
# On the GPU machine: the cuda-samples programs of issue 31, built here with
# the machine's nvcc, each run natively and through the stand-in (a one-VM
# daemon on the cuda executor) in the same call; one line per program with
# both outcomes (pass, waive or fail, and the program's own last verdict
# line), the stand-in's last lines where the two differ. Last line:
#   samples31_same=N/M native_pass=P standin_pass=Q
# (same: the stand-in's outcome is the native one, or a waive where the
# stand-in says why in libcuda's comments: see the report for which).
#
# Carried: the samples under .carry/samples-31/ (NVIDIA/cuda-samples: its
# Common/ and Samples/ folders), and the release fairvgpu and libcuda.so
# (target/release, or R=.carry/release).
# usage: scripts/gpu/samples-31.sh [SAMPLE...]   (default: the nine below)
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-target/release}
S=${S:-.carry/samples-31}
W=/tmp/fvg-s31; rm -rf $W; mkdir -p $W/lib $W/bin $W/logs
[ -d "$S/Common" ] && [ -d "$S/Samples" ] || { echo "no samples under $S (Common/, Samples/)"; exit 2; }
cp $R/libcuda.so $W/lib/libcuda.so.1
header
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -1
# cuFFT and the runtime as the machine has them.
LIBS=""
for so in libcudart.so.13 libcufft.so.12 libcufft.so.11; do
    f=$(find /usr/local /opt /usr/lib -name "$so" 2>/dev/null | head -1)
    [ -n "$f" ] && LIBS="$LIBS:$(dirname "$f")"
done
LIBS=$(echo "$LIBS" | tr ':' '\n' | awk 'NF && !seen[$0]++' | paste -sd:)

# name, folder, and what it needs beyond the program's own sources.
declare -A DIR=(
    [p2pBandwidthLatencyTest]=5_Domain_Specific/p2pBandwidthLatencyTest
    [convolutionFFT2D]=5_Domain_Specific/convolutionFFT2D
    [graphMemoryNodes]=3_CUDA_Features/graphMemoryNodes
    [systemWideAtomics]=0_Introduction/systemWideAtomics
    [cudaCompressibleMemory]=3_CUDA_Features/cudaCompressibleMemory
    [graphConditionalNodes]=3_CUDA_Features/graphConditionalNodes
    [simpleIPC]=0_Introduction/simpleIPC
    [streamOrderedAllocationIPC]=2_Concepts_and_Techniques/streamOrderedAllocationIPC
    [memMapIPCDrv]=3_CUDA_Features/memMapIPCDrv
)
ORDER=(p2pBandwidthLatencyTest convolutionFFT2D graphMemoryNodes systemWideAtomics
    cudaCompressibleMemory graphConditionalNodes simpleIPC streamOrderedAllocationIPC memMapIPCDrv)
names=("$@")
[ ${#names[@]} -eq 0 ] && names=("${ORDER[@]}")

build() {
    local n=$1 d=$S/Samples/${DIR[$1]} o=$W/bin/$1
    mkdir -p $o
    local src=() extra=()
    case $n in
        simpleIPC | streamOrderedAllocationIPC) extra=($S/Common/helper_multiprocess.cpp -lrt) ;;
        memMapIPCDrv)
            extra=($S/Common/helper_multiprocess.cpp -lrt)
            nvcc -arch=sm_90 -ptx -I$S/Common -o $o/memMapIpc_kernel64.ptx $d/memMapIpc_kernel.cu || return 1
            ;;
        convolutionFFT2D) extra=(-lcufft) ;;
    esac
    for f in $d/*.cu $d/*.cpp; do
        [ -e "$f" ] || continue
        [ "$n" = memMapIPCDrv ] && [ "$(basename $f)" = memMapIpc_kernel.cu ] && continue
        src+=("$f")
    done
    nvcc -O2 -arch=sm_90 -rdc=true -I$S/Common -o $o/$n "${src[@]}" "${extra[@]}" -lcuda \
        > $W/logs/$n.build 2>&1 || { tail -5 $W/logs/$n.build; return 1; }
}

# The outcome: pass (rc 0), waive (rc 2, the samples' EXIT_WAIVED), fail.
outcome() { case $1 in 0) echo pass ;; 2) echo waive ;; *) echo "fail($1)" ;; esac; }
verdict() { grep -aiE 'pass|fail|waiv|error' "$1" | tail -1 | tr -s ' ' | cut -c1-90; }

daemon_start $W 40960

same=0 total=0 npass=0 spass=0
for n in "${names[@]}"; do
    total=$((total + 1))
    if ! build $n; then
        printf '%-28s build FAILED\n' $n
        continue
    fi
    o=$W/bin/$n
    (cd $o && LD_LIBRARY_PATH=$NV:$LIBS timeout 120 ./$n > $W/logs/$n.native 2>&1); nrc=$?
    (cd $o && FAIRVGPU_LIBCUDA_DEBUG=1 FAIRVGPU_SOCKET=$W/run/vm1.sock \
        LD_LIBRARY_PATH=$W/lib:$LIBS timeout 120 ./$n > $W/logs/$n.standin 2>&1); src=$?
    no=$(outcome $nrc) so=$(outcome $src)
    [ $nrc -eq 0 ] && npass=$((npass + 1))
    [ $src -eq 0 ] && spass=$((spass + 1))
    [ "$no" = "$so" ] && same=$((same + 1))
    printf '%-28s native=%-9s stand-in=%-9s %s\n' $n "$no" "$so" "$([ "$no" = "$so" ] && echo same || echo DIFFERS)"
    echo "   native:   $(verdict $W/logs/$n.native)"
    echo "   stand-in: $(verdict $W/logs/$n.standin)"
    if [ "$no" != "$so" ]; then
        tail -8 $W/logs/$n.standin | sed 's/^/   | /'
    fi
done
daemon_stop
cp $W/logs/*.native $W/logs/*.standin $W/logs/daemon.log $OUT/ 2>/dev/null
echo "samples31_same=$same/$total native_pass=$npass standin_pass=$spass"
