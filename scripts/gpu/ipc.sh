#!/usr/bin/env bash
# On the GPU machine: IPC memory and event handles between processes of
# one VM.
#   1. Natively, in one process (scripts/gpu/ipc_probe.c): which memory one
#      context reaches that another context of the process allocated (what
#      the host's IPC is built on: every guest process of a VM is a context
#      of one worker).
#   2. tests/c/ipc.c's exporter, importer and stale-handle processes,
#      natively (two real processes, the driver's own IPC) and through the
#      stand-in with the daemon on the cuda executor: the same checks, the
#      same verdicts expected but where the line says the two differ.
# Carried: the release fairvgpu and libcuda.so in $R.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
probe ipc_probe /tmp/fvg-ipc 2>&1 | tee "$OUT/ipc.log"
for k in plain interprocess; do
    /tmp/fvg-ipc/ipc_probe $k 2>&1 | tee -a "$OUT/ipc.log"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/ipc.log"
done

W=/tmp/fvg-ipc2; rm -rf $W; mkdir -p $W/lib $W/run $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
ln -s libcuda.so.1 $W/lib/libcuda.so
cc -O2 -Wall -o $W/ipc tests/c/ipc.c -L$W/lib -lcuda || exit 1

# Waits (up to 30 s) for a line starting with $2 in file $1.
await() { for _ in $(seq 300); do grep -q "^$2" "$1" && return 0; sleep 0.1; done; echo "no \"$2\" in $1"; return 1; }

# One exporter, one importer, one stale opener, with LD_LIBRARY_PATH $1
# (and FAIRVGPU_SOCKET set or not); $2 names the run.
flow() {
    local lib=$1 name=$2 d=$W/$2
    mkdir -p $d; mkfifo $d/e.in $d/i.in
    exec 3<>$d/e.in 4<>$d/i.in
    LD_LIBRARY_PATH=$lib timeout 60 $W/ipc export <$d/e.in >$d/e.out 2>&1 & local E=$!
    await $d/e.out "handle " || { kill $E; return 1; }
    await $d/e.out "event " || { kill $E; return 1; }
    local H EH; H=$(sed -n 's/^handle //p' $d/e.out); EH=$(sed -n 's/^event //p' $d/e.out)
    LD_LIBRARY_PATH=$lib timeout 60 $W/ipc import "$H" "$EH" <$d/i.in >$d/i.out 2>&1 & local I=$!
    await $d/i.out "written"; echo check >&3
    await $d/e.out "freed"; echo after-free >&4
    wait $I; echo "importer rc=$?" >> $d/i.out
    LD_LIBRARY_PATH=$lib timeout 60 $W/ipc stale "$H" >$d/s.out 2>&1; echo "stale rc=$?" >> $d/s.out
    echo exit >&3; wait $E; echo "exporter rc=$?" >> $d/e.out
    exec 3>&- 4>&-
    echo "== $name"; cat $d/e.out $d/i.out $d/s.out | grep -v '^handle \|^event '
}

flow $NV native
daemon_start $W 4096
flow $W/lib standin
daemon_stop
echo "== daemon warnings, worker ends"
grep -aE 'WARN|ERROR|exited|signal|restart' $W/logs/daemon.log | head -20
n_ok=$(cat $W/native/*.out | grep -c '^ok:'); n_bad=$(cat $W/native/*.out | grep -c '^FAILED')
s_ok=$(cat $W/standin/*.out | grep -c '^ok:'); s_bad=$(cat $W/standin/*.out | grep -c '^FAILED')
echo "ipc_native_ok=$n_ok ipc_native_failed=$n_bad ipc_standin_ok=$s_ok ipc_standin_failed=$s_bad"
