#!/usr/bin/env bash
# A CUDA-graphed PyTorch training (migrate_torch.py, MT_GRAPH=1) natively
# and through the stand-in on one daemon, no move: whether capture and
# replay run there. Output in $OUT. usage: R=.carry/X bash THIS
set -uo pipefail
R=${R:-.carry/release}
W=/tmp/fvg-gp; rm -rf $W; mkdir -p $W/lib $W/run
cp $R/libcuda.so $W/lib/libcuda.so.1; cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so.1
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
memory_limit_mib = 20480
TOML
export MT_GRAPH=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
timeout 120 python3 scripts/gpu/migrate_torch.py 20 > $OUT/native.txt 2>&1; echo "native rc=$?"
tail -3 $OUT/native.txt
RUST_LOG=${DAEMON_LOG:-info} $R/fairvgpu serve --config $W/host.toml 2> $OUT/daemon.txt &
for _ in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib:${LD_LIBRARY_PATH:-} \
  timeout 120 python3 scripts/gpu/migrate_torch.py 20 > $OUT/standin.txt 2>&1; echo "standin rc=$?"
tail -5 $OUT/standin.txt
kill %1; wait
python3 scripts/gpu/migrate_torch.py compare $OUT/native.txt $OUT/standin.txt
grep -aiE "warn|error|refus|panick" $OUT/daemon.txt | tail -8 | cut -c1-400; grep -aE "graph" $OUT/daemon.txt | tail -12 | cut -c1-300; grep -a "warm-up" $OUT/native.txt $OUT/standin.txt
