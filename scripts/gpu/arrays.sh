#!/usr/bin/env bash
# On the GPU machine: CUDA arrays, texture and surface objects.
#   1. tests/c/arrays.c (every copy path with an array at one end, the
#      objects' descriptions, refused cases), built with plain cc, natively
#      and through the stand-in with the daemon on the cuda executor
#      (`strict` there: textures over memory the process does not own are
#      refused by the host; natively the driver's answer is only printed).
#   2. scripts/gpu/texsurf.cu, built with nvcc: a kernel samples two texture
#      objects and writes a surface object, natively and through the
#      stand-in, every value checked.
# Carried: the release fairvgpu and libcuda.so in $R.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-arrays; rm -rf $W; mkdir -p $W/lib $W/run $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
ln -s libcuda.so.1 $W/lib/libcuda.so
header | tee "$OUT/arrays.log"
cc -O2 -Wall -o $W/arrays tests/c/arrays.c -L$W/lib -lcuda || exit 1
nvcc -O2 -arch=sm_90 -o $W/texsurf scripts/gpu/texsurf.cu || exit 1

# Runs both programs with LD_LIBRARY_PATH $1, arrays.c with args $3; $2
# names the run.
both() {
    local lib=$1 name=$2; shift 2
    echo "== $name: arrays $*"
    LD_LIBRARY_PATH=$lib timeout 60 $W/arrays "$@" > $W/$name.out 2>&1; echo "arrays rc=$?" >> $W/$name.out
    LD_LIBRARY_PATH=$lib timeout 60 $W/texsurf >> $W/$name.out 2>&1; echo "texsurf rc=$?" >> $W/$name.out
    cat $W/$name.out
}

both $NV native
daemon_start $W 4096
both $W/lib standin strict
daemon_stop
echo "== daemon warnings, worker ends"
grep -aE 'WARN|ERROR|exited|signal|restart' $W/logs/daemon.log | head -20
cat $W/native.out $W/standin.out >> "$OUT/arrays.log"
n_ok=$(grep -c '^ok:' $W/native.out); s_ok=$(grep -c '^ok:' $W/standin.out)
n_rc=$(grep -h 'rc=' $W/native.out | tr '\n' ' '); s_rc=$(grep -h 'rc=' $W/standin.out | tr '\n' ' ')
echo "arrays_native_ok=$n_ok arrays_standin_ok=$s_ok native: $n_rc standin: $s_rc"
