#!/usr/bin/env bash
# On the GPU machine: what waking a sleeping thread costs there
# (scripts/gpu/wake.c, with the machine's idle states), and
# scripts/gpu/burst.cu natively and through the stand-in ($R), each with and
# without a /dev/cpu_dma_latency request of 0 held meanwhile (no CPU in a
# deep idle state), alternated twice.
# usage: R=.carry/release bash scripts/gpu/wake.sh
set -uo pipefail
. scripts/gpu/lib.sh
header
echo "== virtualization: $(systemd-detect-virt 2>/dev/null || echo unknown);" \
  "cpuidle driver $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null)," \
  "governor $(cat /sys/devices/system/cpu/cpuidle/current_governor_ro 2>/dev/null)"
for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
  [ -d "$s" ] && echo "   idle state $(cat $s/name): exit latency $(cat $s/latency) us"
done
W=/tmp/wake; rm -rf $W; mkdir -p $W/lib
cc -O2 -pthread -o $W/wake scripts/gpu/wake.c && $W/wake
nvcc -O2 -o $W/burst scripts/gpu/burst.cu || exit 1
cp "$R/libcuda.so" $W/lib/libcuda.so.1
# Holds a PM QoS request of 0 us on /dev/cpu_dma_latency until killed.
hold() {
  python3 -c 'import os, struct, time
f = os.open("/dev/cpu_dma_latency", os.O_WRONLY); os.write(f, struct.pack("i", 0)); time.sleep(3600)' &
  Q=$!; sleep 0.2
}
daemon_start $W 8000
for k in 1 2; do
  echo "== native, run $k"; LD_LIBRARY_PATH=$NV $W/burst
  echo "== through the stand-in, run $k"; LD_LIBRARY_PATH=$W/lib $W/burst
  hold
  echo "== native, cpu_dma_latency 0, run $k"; LD_LIBRARY_PATH=$NV $W/burst
  echo "== through the stand-in, cpu_dma_latency 0, run $k"; LD_LIBRARY_PATH=$W/lib $W/burst
  kill $Q; wait $Q 2>/dev/null
done
daemon_stop
grep -aE 'WARN|ERROR' $W/logs/daemon.log | head -5
