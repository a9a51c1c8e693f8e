#!/usr/bin/env bash
# On the GPU machine: two MPS control daemons (a, b) on one GPU. Does a
# client of b, its contexts made ahead, serve a guest's first work while a's
# clients are torn down after one of them faulted? And what do b's idle
# contexts cost a's clients? (scripts/gpu/standby_probe.c says what each
# mode does.) Last line: `standby_recovery_ms=… fresh_recovery_ms=…`.
set -u
. scripts/gpu/lib.sh
export PATH=/usr/local/nvidia/bin:$PATH
W=/tmp/fvg-standby
rm -rf "$W"; mkdir -p "$W"
header
nvcc -O2 -o "$W/p" scripts/gpu/standby_probe.c -L$NV -lcuda || exit 1
P=$W/p
on() { local d=$1; shift; CUDA_MPS_PIPE_DIRECTORY=$W/$d/pipe CUDA_MPS_LOG_DIRECTORY=$W/$d/log "$@"; }
for d in a b; do
  mkdir -p "$W/$d/pipe" "$W/$d/log"
  on $d nvidia-cuda-mps-control -d || { echo "control $d failed"; exit 1; }
done
t() { date +%s.%N; }

PIN=288   # MiB a worker registers: the default 256 MiB pinned pool and its arenas
# Starts standby $3 on daemon $1 with $2 contexts, reading fifo $W/go$3.
standby() {
  local d=$1 n=$2 i=$3
  mkfifo "$W/go$i"
  on "$d" "$P" standby "$n" $PIN < "$W/go$i" > "$W/sb$i.log" 2>&1 &
  SB[$i]=$!
  eval "exec $((10 + i))>$W/go$i"
}
ready() { for _ in $(seq 500); do grep -aq ready "$W/sb$1.log" && return 0; sleep 0.02; done; echo "standby $1 not ready"; cat "$W/sb$1.log"; }
rates() { grep -ah kernels_per_s "$W"/c?.log | awk '{s[$2]=s[$2]" "$4} END {for (k in s) print "client " k ":" s[k]}' | sort; }
used() { echo "GPU memory used: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; }

echo "== 1. four clients of a for 6 s; at 2 s four standbys of b make 2 contexts each"
for i in 0 1 2 3; do on a "$P" client $i 0 $PIN > "$W/c$i.log" 2>&1 & C[$i]=$!; done
sleep 2; used; echo "standbys start $(t)"
for i in 0 1 2 3; do standby b 2 $i; done
for i in 0 1 2 3; do ready $i; done; echo "standbys ready $(t)"; used
sleep 4; kill -9 ${C[@]}; wait ${C[@]} 2>/dev/null
rates
cat "$W"/sb?.log
sleep 1; used

echo "== 2. four clients of a (0 faults at 3 s, the others killed), the four standbys of b told to go; a fresh client of b at once"
for i in 0 1 2 3; do f=0; [ $i = 0 ] && f=3; on a "$P" client $i $f $PIN > "$W/c$i.log" 2>&1 & C[$i]=$!; done
for _ in $(seq 5000); do grep -aq "fault seen" "$W/c0.log" && break; sleep 0.002; done; tf=$(t)
kill -9 ${C[1]} ${C[2]} ${C[3]}
for i in 0 1 2 3; do eval "echo go >&$((10 + i))"; done
tg=$(t)
on b "$P" fresh > "$W/freshb.log" 2>&1 &
FB=$!
for i in 0 1 2 3; do wait ${C[$i]} 2>/dev/null; echo "client $i reaped $(t)"; done; tr=$(t)
echo "fault noticed by the script $tf; standbys told $tg; a's clients reaped $tr"
on a "$P" fresh > "$W/fresh.log" 2>&1; tn=$(t)
wait $FB
cat "$W"/c?.log | grep -av kernels_per_s
sleep 0.5
cat "$W"/sb?.log "$W/freshb.log" "$W/fresh.log"
ends=$(grep -ah 'standby work' "$W"/sb?.log | awk '{printf "%.6f\n", $4 + $12 / 1000}' | sort -n | tail -1)
fault=$(grep -ah 'fault seen' "$W/c0.log" | awk '{print $7}')
echo "== 3. the standbys gone, a fresh client of b"
kill -9 ${SB[@]}; wait ${SB[@]} 2>/dev/null
on b "$P" fresh; echo "rc=$?"
for d in a b; do echo quit | timeout 10 env CUDA_MPS_PIPE_DIRECTORY=$W/$d/pipe nvidia-cuda-mps-control; done
sleep 1; pgrep -a nvidia-cuda-mps || true
used
awk -v f="$fault" -v e="$ends" -v n="$tn" 'BEGIN {printf "standby_recovery_ms=%.0f fresh_recovery_ms=%.0f\n", (e - f) * 1e3, (n - f) * 1e3}'
