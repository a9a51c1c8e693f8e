#!/usr/bin/env bash
# A CUDA-graphed PyTorch training (migrate_torch.py, MT_GRAPH=1) natively
# and through the stand-in on one daemon, no move: whether capture and
# replay run there. The daemon logs at $DAEMON_LOG (default info); output
# in $OUT. usage: R=.carry/X bash THIS
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-gp; rm -rf $W; mkdir -p $W/lib
cp $R/libcuda.so $W/lib/libcuda.so.1; cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so.1
export MT_GRAPH=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
timeout 120 python3 scripts/gpu/migrate_torch.py 20 > $OUT/native.txt 2>&1; echo "native rc=$?"
tail -3 $OUT/native.txt
daemon_start $W 20480
LD_LIBRARY_PATH=$W/lib:${LD_LIBRARY_PATH:-} \
  timeout 120 python3 scripts/gpu/migrate_torch.py 20 > $OUT/standin.txt 2>&1; echo "standin rc=$?"
tail -5 $OUT/standin.txt
daemon_stop
cp $W/logs/daemon.log $OUT/daemon.txt
python3 scripts/gpu/migrate_torch.py compare $OUT/native.txt $OUT/standin.txt
grep -aiE "warn|error|refus|panick" $OUT/daemon.txt | tail -8 | cut -c1-400; grep -aE "graph" $OUT/daemon.txt | tail -12 | cut -c1-300; grep -a "warm-up" $OUT/native.txt $OUT/standin.txt
