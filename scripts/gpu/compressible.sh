#!/usr/bin/env bash
# On the GPU machine: compressible VMM memory (cuMemCreate with
# CU_MEM_ALLOCATION_COMP_GENERIC), scripts/gpu/compress_probe.c run natively
# and through the stand-in (a one-VM daemon on the cuda executor) in the
# same call; the two outputs must be the same line for line (the attribute,
# both granularities, the compression type the driver gave, the bytes, the
# error for an undefined type). On a machine with two GPUs (nvidia-h100-x2)
# the probe holds its memory while the vGPU moves GPU 0 -> 1, then checks
# the bytes and the compression type again.
# Carried: the release fairvgpu and libcuda.so in $R.
# Last line: compress_same=0|1 moved=0|1|- after_move_ok=0|1|-
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-compress; rm -rf $W; mkdir -p $W/lib $W/logs $W/run
cp $R/libcuda.so $W/lib/libcuda.so.1
header
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc -O2 -o $W/probe scripts/gpu/compress_probe.c -L$NV -lcuda || exit 1

echo "== native"
LD_LIBRARY_PATH=$NV timeout 60 $W/probe > $W/logs/native 2>&1; echo "rc=$?" >> $W/logs/native
cat $W/logs/native

gpus=$(nvidia-smi -L | wc -l)
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[placement]
enabled = false
[[vm]]
name = "vm1"
tenant = "t"
gpu = 0
memory_limit_mib = 4096
TOML
RUST_LOG=info $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log &
D=$!
for _ in $(seq 200); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
export FAIRVGPU_SOCKET=$W/run/vm1.sock

echo "== through the stand-in"
LD_LIBRARY_PATH=$W/lib timeout 60 $W/probe > $W/logs/standin 2>&1; echo "rc=$?" >> $W/logs/standin
cat $W/logs/standin
if diff $W/logs/native $W/logs/standin > $W/logs/diff; then same=1; else same=0; cat $W/logs/diff; fi

moved=- after=-
if [ "$gpus" -ge 2 ]; then
    echo "== through the stand-in, the vGPU moved GPU 0 -> 1 while it holds the memory"
    mkfifo $W/in; exec 3<>$W/in
    LD_LIBRARY_PATH=$W/lib timeout 120 $W/probe hold < $W/in > $W/logs/hold 2>&1 &
    P=$!
    for _ in $(seq 300); do grep -q '^holding' $W/logs/hold && break; sleep 0.1; done
    out=$($R/fairvgpu migrate --config $W/host.toml --vm vm1 --gpu 1 2>&1); echo "$out"
    echo "$out" | grep -q "on GPU 1 " && moved=1 || moved=0
    echo go >&3; wait $P; echo "rc=$?" >> $W/logs/hold; exec 3>&-
    cat $W/logs/hold
    if grep -q '^after the move: same' $W/logs/hold &&
       grep -q "^after the move: compression type $(sed -n 's/^created: compression type //p' $W/logs/native)\$" $W/logs/hold; then
        after=1
    else
        after=0
    fi
    grep -E "migrat|stays on|refused|compress" $W/logs/daemon.log | tail -n 10
fi
unset FAIRVGPU_SOCKET
kill $D; wait $D 2>/dev/null
cp $W/logs/* $OUT/ 2>/dev/null
echo "compress_same=$same moved=$moved after_move_ok=$after"
