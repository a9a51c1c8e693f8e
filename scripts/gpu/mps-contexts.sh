#!/usr/bin/env bash
# On the GPU machine: a worker that is an MPS client makes `[[gpu]]
# mps_processes` contexts ahead, before the sandbox confines it (it cannot
# make one after). The daemon runs one VM on an MPS GPU with
# mps_processes = $N (default 6); eight guest processes (cuda-samples'
# vectorAdd) run at once: N of them pass, the others are turned away with
# CUDA_ERROR_MPS_MAX_CLIENTS_REACHED (808). Also prints how long the worker
# took to start (cuInit through MPS, the contexts made ahead).
# Carried: .samples/bin and the release fairvgpu and libcuda.so in $R.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
N=${N:-6}
export PATH=/usr/local/nvidia/bin:$PATH
W=/tmp/fvg-mpsctx; rm -rf $W; mkdir -p $W/lib $W/run $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[[gpu]]
index = 0
mps = true
mps_processes = $N
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 8192
TOML
header
RUST_LOG=info $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log &
D=$!
for i in $(seq 200); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
sleep 2
P=""
for k in $(seq 8); do
    (cd .samples/bin/vectorAdd && FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib \
        timeout 60 ./vectorAdd > $W/logs/vectorAdd.$k 2>&1; echo "process $k: rc=$?") &
    P="$P $!"
done
wait $P
ok=$(grep -l "Test PASSED" $W/logs/vectorAdd.* | wc -l)
echo "== passed: $ok of 8 at once"
grep -h "cuCtx\|context\|rror" $W/logs/vectorAdd.* | sort | uniq -c | head
kill $D; wait $D 2>/dev/null
echo "== daemon log (worker start-up, warnings)"
grep -aE 'worker serving|WARN|ERROR' $W/logs/daemon.log | head -20
echo "mps_contexts_ok=$ok/8 mps_processes=$N"
