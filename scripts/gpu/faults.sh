#!/usr/bin/env bash
# On the GPU machine: a guest process's faults, printf and memory, through
# a one-VM daemon (cuda executor) and natively, with tests/c/faults.c
# (kernels of worker/kernels/faults.ptx) and NVIDIA's simplePrintf
# (carried in .carry/samples with the samples' Common folder).
#  1. printf: faults' and simplePrintf's lines through the stand-in equal
#     the native ones; the daemon's log holds none of them.
#  2. A checked neighbour process loops for the whole run while other
#     processes of the same VM fail a device-side assert, read address 0x10
#     and trap, in turn; after each, a new process must compute (ms until it
#     does); the neighbour's failed rounds are counted.
#  3. Cross-process reads: one process holds a buffer, another process of
#     the same VM reads it by address with a kernel (natively: illegal
#     address).
# Carried: fairvgpu and libcuda.so in $R (default .carry/release).
# SLOTS=N runs the VM with N process slots (default: the config's default);
# NO_BENCH=1 leaves out the overhead bench at the end.
# Last line: next_process_ok=… next_process_ms=… native_process_ms=… neighbour_errors=…
#   printf_lines=N/M host_log_guest_lines=… cross_process_reads=…
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-faults; rm -rf $W; mkdir -p $W/lib $W/bin
cp $R/libcuda.so $W/lib/libcuda.so.1; ln -sf libcuda.so.1 $W/lib/libcuda.so
FP=worker/kernels/faults.ptx; KP=worker/kernels/fairvgpu.ptx
header
gcc -O2 -Itests/c -o $W/bin/faults tests/c/faults.c -L$W/lib -lcuda || echo "build failed"
nvcc -O2 -I.carry/samples/Common -o $W/bin/simplePrintf .carry/samples/simplePrintf/simplePrintf.cu || echo "simplePrintf build failed"
SI="env LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH"
echo "== natively"
for m in printf assert compute trap compute; do $W/bin/faults $FP $m > $W/n.$m.out 2> $W/n.$m.err; echo "$m rc=$?"; cat $W/n.$m.out; sed 's/^/stderr: /' $W/n.$m.err; done
$W/bin/faults $FP hold 5 > $W/n.hold.out 2>&1 & H=$!
sleep 1.5; addr=$(sed -n 's/^holding //p' $W/n.hold.out)
$W/bin/faults $FP peek ${addr:-0x10} $KP 2>&1 | tee $W/n.peek.out; kill $H 2>/dev/null; wait $H 2>/dev/null
$W/bin/simplePrintf > $W/n.sp.out 2>&1; echo "simplePrintf rc=$?"
# What a new process takes natively from its start until it has computed
# (the slowest of three), against which the next process after a fault
# through the stand-in is read.
native_ms=0
for _ in 1 2 3; do
  t0=$(date +%s%N); $W/bin/faults $FP compute > /dev/null 2>&1
  ms=$(( ($(date +%s%N) - t0) / 1000000 )); [ $ms -gt $native_ms ] && native_ms=$ms
done
echo "a new native process computes in $native_ms ms (slowest of 3)"
# Each guest process is served by a worker of its own; SLOTS=N: N at once
# ([[vm]] process_slots).
if [ "${SLOTS:-0}" -gt 0 ]; then
  VM_KEYS="process_slots = $SLOTS"
fi
echo "== VM keys: ${VM_KEYS:-none}"
daemon_start $W 8192
sleep 3
echo "-- the daemon's workers on the GPU, idle (pid, GPU memory)"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
echo "== through the stand-in"
$SI $W/bin/faults $FP printf > $W/s.printf.out 2> $W/s.printf.err; echo "printf rc=$?"; cat $W/s.printf.out
$SI $W/bin/simplePrintf > $W/s.sp.out 2>&1; echo "simplePrintf rc=$?"
echo "-- simplePrintf, native | stand-in"; paste -d'|' $W/n.sp.out $W/s.sp.out | head -12
# simplePrintf's blocks print in the order the GPU runs them: compared sorted.
want=$(( $(grep -c 'Value is' $W/n.sp.out) + $(grep -c 'kernel 3 thread' $W/n.printf.out) ))
got=$(( $(grep -c 'Value is' $W/s.sp.out) + $(grep -c 'kernel 3 thread' $W/s.printf.out) ))
cmp -s <(grep 'Value is' $W/n.sp.out | sort) <(grep 'Value is' $W/s.sp.out | sort) &&
  cmp -s $W/n.printf.out $W/s.printf.out && same=1 || same=0
echo "printf lines native $want, through the stand-in $got, identical: $same"
echo "-- a checked neighbour loops; faults in other processes of the VM"
$SI $W/bin/faults $FP loop 25 > $W/s.loop.out 2>&1 & L=$!
sleep 2
ok=1; worst=0
for k in assert read trap; do
  case $k in read) args="peek 0x10 $KP";; *) args=$k;; esac
  $SI $W/bin/faults $FP $args > $W/s.$k.out 2> $W/s.$k.err; echo "$k rc=$?: $(cat $W/s.$k.out)"; sed 's/^/stderr: /' $W/s.$k.err | head -3
  t0=$(date +%s%N); done_=0
  for i in $(seq 400); do
    if $SI $W/bin/faults $FP compute 2>/dev/null | grep -q 'compute sync: CUDA_SUCCESS'; then done_=1; break; fi
    sleep 0.02
  done
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "after $k: next process computed=$done_ in $ms ms"
  [ $done_ = 1 ] || ok=0; [ $ms -gt $worst ] && worst=$ms
  sleep 3  # the GPU's spare worker, bound to the process that computed, is started again
done
wait $L; cat $W/s.loop.out
nerr=$(grep -o 'loop: [0-9]* rounds, [0-9]* errors' $W/s.loop.out | sed 's/.*, \([0-9]*\) errors/\1/')
# What the neighbour's own output holds that is not its own line: text of
# another process's kernels.
leak=$(grep -v -c '^loop: ' $W/s.loop.out)
echo "-- cross-process read"
$SI $W/bin/faults $FP hold 8 > $W/s.hold.out 2>&1 & H=$!
sleep 2; addr=$(sed -n 's/^holding //p' $W/s.hold.out)
$SI $W/bin/faults $FP peek ${addr:-0x10} $KP 2>&1 | tee $W/s.peek.out
kill $H 2>/dev/null; wait $H 2>/dev/null
grep -q 'peek: CUDA_SUCCESS, read 1234.5' $W/s.peek.out && cross=1 || cross=0
daemon_stop
logn=$(grep -c -E 'kernel 3 thread|Hello from thread|Assertion' $W/logs/daemon.log)
echo "== daemon log (warnings and errors)"; grep -aE 'WARN|ERROR' $W/logs/daemon.log | head -12
if [ -z "${NO_BENCH:-}" ]; then
  echo "== bench overhead (the launch+sync loop pays the flush of kernel output)"
  RUST_LOG=warn timeout 200 $R/fairvgpu bench overhead --executor cuda --scale 0.3 2>&1 | tail -14
fi
echo "next_process_ok=$ok next_process_ms=$worst native_process_ms=$native_ms neighbour_errors=${nerr:-missing} neighbour_foreign_lines=$leak printf_lines=$got/$want printf_identical=$same host_log_guest_lines=$logn cross_process_reads=$cross"
