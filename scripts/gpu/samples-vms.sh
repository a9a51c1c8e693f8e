#!/usr/bin/env bash
# On the GPU machine: NVIDIA's whole cuda-samples set (built by
# samples_build from .carry/upstream.tar.xz) run 4 VMs x 4 processes at a
# time through one daemon on the cuda executor, in the daemon's default
# configuration (VM_KEYS adds lines to each [[vm]]), against the same
# programs run natively one at a time in the same call. A program that
# passes natively and fails concurrently is run again alone through the
# stand-in, and both results are printed.
# Each program's native result is kept in .samples/native.txt for a later
# call on the same machine (NATIVE=1 redoes it; PHASE=native stops after
# it, resuming where an earlier call stopped; PHASE=vms starts from it).
# usage: R=.carry/release [VMS=4] [PER_VM=4] [T=60] scripts/gpu/samples-vms.sh
# Last line: samples_vms=VMSxPER_VM pass=N/M alone_pass=K failed=NAMES
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
VMS=${VMS:-4}; PER_VM=${PER_VM:-4}; T=${T:-60}
W=/tmp/fvg-svms; rm -rf $W; mkdir -p $W/lib $W/run $W/logs $W/out
cp $R/libcuda.so $W/lib/libcuda.so.1
cp $R/libnvidia_ml.so $W/lib/libnvidia-ml.so.1 2>/dev/null || true
header
samples_build || exit 1
LIBS=""
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcufft.so.12 libnvrtc.so.13; do
    f=$(find /usr/local /opt /usr/lib -name "$so" 2>/dev/null | head -1)
    [ -n "$f" ] && LIBS="$LIBS:$(dirname "$f")"
done
names=($(ls .samples/bin))
TR=$PWD/scripts/gpu/timed_run.py

# 1. Natively, one at a time: which pass.
if [ -n "${NATIVE:-}" ] || [ ! -f .samples/native.txt ]; then : > .samples/native.txt; fi
if [ "${PHASE:-}" != vms ]; then
    # Resumed where an earlier call on this machine stopped.
    for n in "${names[@]}"; do
        grep -q "^$n " .samples/native.txt && continue
        (cd .samples/bin/$n && LD_LIBRARY_PATH=$NV$LIBS python3 $TR 0 $T $W/out/$n.native ./$n >/dev/null)
        echo "$n $?" >> .samples/native.txt
    done
fi
npass=$(awk '$2 == 0' .samples/native.txt | wc -l)
echo "== natively, one at a time: $npass of ${#names[@]} pass"
awk '$2 != 0 { printf "native rc=%s %s\n", $2, $1 }' .samples/native.txt
[ "${PHASE:-}" = native ] && exit 0

# 2. Through the stand-in: VMS VMs, PER_VM processes of each at a time.
{
    echo "[daemon]"; echo "run_dir = \"$W/run\""; echo 'executor = "cuda"'
    for v in $(seq $VMS); do
        printf '[[vm]]\nname = "vm%s"\ntenant = "t%s"\nmemory_limit_mib = %s\n%s\n' \
            $v $v $((60000 / VMS)) "${VM_KEYS:-}"
    done
} > $W/host.toml
RUST_LOG=info,daemon::supervisor=debug $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log &
D=$!
for _ in $(seq 200); do [ -S $W/run/vm$VMS.sock ] && break; sleep 0.1; done
sleep 2
echo "-- idle: the daemon's processes on the GPU (pid, GPU memory)"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
# One runner per (VM, place): it takes the next program from the queue.
awk '$2 == 0 { print $1 }' .samples/native.txt > $W/queue
runner() {
    local vm=$1 n
    while n=$(flock $W/queue.lock sh -c 'head -1 '$W'/queue; sed -i 1d '$W'/queue') && [ -n "$n" ]; do
        (cd .samples/bin/$n && FAIRVGPU_SOCKET=$W/run/vm$vm.sock LD_LIBRARY_PATH=$W/lib$LIBS \
            python3 $TR $D $T $W/out/$n.vms ./$n >/dev/null)
        echo "$n $? vm$vm" >> $W/vms.txt
    done
}
t0=$(date +%s)
runners=()
for v in $(seq $VMS); do for _ in $(seq $PER_VM); do runner $v & runners+=($!); done; done
wait "${runners[@]}"
echo "== $VMS VMs x $PER_VM at a time: $(wc -l < $W/vms.txt) programs in $(( $(date +%s) - t0 )) s"
pass=$(awk '$2 == 0' $W/vms.txt | wc -l)
failed=$(awk '$2 != 0 { print $1 }' $W/vms.txt | sort | paste -sd, -)
alone=0
for n in $(awk '$2 != 0 { print $1 }' $W/vms.txt); do
    echo "-- $n failed concurrently ($(awk -v n=$n '$1 == n { print "rc=" $2 " on " $3 }' $W/vms.txt)); its last lines:"
    tail -4 $W/out/$n.vms | sed 's/^/   | /'
    (cd .samples/bin/$n && FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib$LIBS \
        python3 $TR $D $T $W/out/$n.alone ./$n >/dev/null); rc=$?
    echo "   alone through the stand-in: rc=$rc"
    [ $rc = 0 ] && alone=$((alone + 1))
done
echo "-- after the run: the daemon's processes on the GPU"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
sleep 2
echo "-- 2 s later: each worker on the GPU, what it serves, and the programs still running"
for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
    echo "$p $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-120) | $(grep -a "pid=$p\b" $W/logs/daemon.log | tail -1 | cut -c1-160)"
done
ps -eo pid,ppid,etimes,stat,args | grep -F .samples/bin | grep -v grep | head -10
kill $D; wait $D 2>/dev/null
echo "== daemon warnings and errors (first 20)"; grep -aE 'WARN|ERROR' $W/logs/daemon.log | head -20
echo "samples_vms=${VMS}x$PER_VM pass=$pass/$npass alone_pass=$alone failed=${failed:-none}"
