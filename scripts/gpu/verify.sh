#!/usr/bin/env bash
# On the GPU machine, in one call: everything this tree changed since the
# last GPU results, each step bounded so that one stuck step costs only
# itself. Carried: .samples/bin (scripts/gpu/build-samples.sh) and the
# stripped release fairvgpu and libcuda.so in .carry/release.
#   1. cuda-samples natively and through the stand-in (simpleCUFFT needs the
#      tools module table's slot 7; matrixMul with lone-holder extensions)
#   2. cuFFT's slot 7 and a transform checked against a direct DFT
#   3. one VM under abuse, two measured (contexts reused and rationed)
#   4. PyTorch, CuPy, JAX natively and through the stand-in; two VMs 1:2
#   5. three guests 1:2:3 under the scheduler (aggregate and MMR)
#   6. four small-kernel guests time-sliced against co-running under MPS
#   7. whether a confined MPS worker makes new contexts
#   8. which memory one context reaches of another's in one process (IPC)
#   9. CUDA arrays, texture and surface objects (tests/c/arrays.c; a kernel
#      sampling textures and writing a surface, scripts/gpu/texsurf.cu)
# Every step's output goes to $OUT/verify.log; the last lines are each
# step's own last line.
# One device call may run 10 minutes, so STEPS picks the steps of one call
# (default: all, for a longer limit); each step's time limit is its own.
# usage: R=.carry/release [STEPS="conformance cufft"] bash scripts/gpu/verify.sh
set -uo pipefail
. scripts/gpu/lib.sh
export R=${R:-.carry/release}
LOG=$OUT/verify.log
: > "$LOG"
STEPS=${STEPS:-conformance cufft hostile frameworks fairness fairness-mps space mps-contexts ipc arrays}
step() {
    local name=$1 limit=$2; shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name (at most ${limit}s)" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -40
    echo "== $name: rc=${PIPESTATUS[0]}" | tee -a "$LOG"
}
header | tee -a "$LOG"
step conformance 330 bash scripts/gpu/conformance.sh
step cufft 90 bash scripts/gpu/cufft.sh
step hostile 180 "$R/fairvgpu" bench hostile --executor cuda --seconds 60 --log "$OUT/hostile-daemon.log"
step frameworks 400 bash scripts/gpu/frameworks.sh
step fairness 150 "$R/fairvgpu" bench fairness --executor cuda
step fairness-mps 150 "$R/fairvgpu" bench fairness --executor cuda --mps --mps-control /usr/local/nvidia/bin/nvidia-cuda-mps-control
step space 300 bash scripts/gpu/space.sh
step mps-contexts 60 bash scripts/gpu/mps-contexts.sh
step ipc 120 bash scripts/gpu/ipc.sh
step arrays 150 bash scripts/gpu/arrays.sh
echo "== last lines" | tee -a "$LOG"
grep -aE '^(samples_pass|good_runs|torch_ok|fairvgpu_mmr|corun_speedup|mps_contexts_ok|ipc_native_ok|arrays_native_ok|texsurf|cufft: (all|forward))|rc=' "$LOG" | tee -a "$LOG.summary"
