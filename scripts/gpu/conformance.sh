#!/usr/bin/env bash
# On the GPU machine: every cuda-samples program (built here by
# scripts/gpu/build-samples.sh into .samples/bin), natively and through the
# stand-in (daemon on the cuda executor), in the same call; compares exit
# status and the program's own verdict line, and prints each program's wall
# and CPU time both ways, the CPU the daemon spent meanwhile and the first
# timing the program prints of its own. A program over 1.05x runs both ways
# twice more, the order turned each time, and the median wall of each way's
# three runs counts (all printed): the CPU-bound ones' own CPU time swings
# by up to a third between runs on the lent machines, in either direction,
# and the least of each way would count a lucky run. Last line:
#   samples_pass=N/M native_pass=M matrixmul_gflops_ratio=R slowest=NAME:R geomean_ratio=G
# Carried: .samples/bin, and the release fairvgpu and libcuda.so (in
# target/release, or stripped in .carry/release with R=.carry/release).
# usage: scripts/gpu/conformance.sh [SAMPLE...]   (default: all)
set -uo pipefail
. scripts/gpu/lib.sh
# The built binaries: target/release, or stripped copies (R=.carry/release).
R=${R:-target/release}
W=/tmp/fvg-conf; rm -rf $W; mkdir -p $W/lib $W/run $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
# The samples' libraries (cuBLAS, cuFFT, NVRTC, the shared runtime), as the
# machine has them.
LIBS=""
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcufft.so.12 libnvrtc.so.13; do
    f=$(find /usr/local /opt /usr/lib -name "$so" 2>/dev/null | head -1)
    [ -n "$f" ] && LIBS="$LIBS:$(dirname "$f")"
done
LIBS=$(echo "$LIBS" | tr ':' '\n' | awk 'NF && !seen[$0]++' | paste -sd:)
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 40960
TOML
header
# The device's attributes, for the sim executor's model of this GPU.
LD_LIBRARY_PATH=$NV python3 - > $OUT/device-attributes.txt <<'PY'
import ctypes
cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
v = ctypes.c_int()
for a in range(1, 148):
    if cu.cuDeviceGetAttribute(ctypes.byref(v), a, 0) == 0:
        print(a, v.value)
PY
echo "== library path for the samples' libraries: $LIBS"
RUST_LOG=warn $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log &
D=$!
for i in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done

# The program's verdict: its last line saying pass, fail or waive.
verdict() { grep -aiE 'pass|fail|waiv' "$1" | tail -1 | tr -s ' ' | cut -c1-100; }
# One field (`wall=…`) of timed_run.py's line.
field() { echo "$2" | sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p"; }
# The first timing a program prints of its own, if any.
own() { grep -aiE '(time|throughput|bandwidth)[^0-9]*[0-9]' "$1" | head -1 | tr -s ' \t' ' ' | cut -c1-60; }
TR=$PWD/scripts/gpu/timed_run.py
# Runs program $1 natively (its output to $2, timed_run.py's line in nl,
# the exit status in nrc), and through the stand-in (to $3; sl, src).
run_native() {
    nl=$(cd .samples/bin/$1 && LD_LIBRARY_PATH=$NV:$LIBS python3 $TR $D $T $2 ./$1); nrc=$?
}
run_standin() {
    sl=$(cd .samples/bin/$1 && FAIRVGPU_LIBCUDA_DEBUG=1 FAIRVGPU_SOCKET=$W/run/vm1.sock \
        LD_LIBRARY_PATH=$W/lib:$LIBS python3 $TR $D $T $2 ./$1); src=$?
}
# Both ways, natively first (TURNED=1: the stand-in first).
run_both() {
    if [ -n "${TURNED:-}" ]; then
        run_standin $1 $3; run_native $1 $2
    else
        run_native $1 $2; run_standin $1 $3
    fi
}
# The median of its arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# Each program's time limit, natively and through the stand-in.
T=${T:-60}
: > $W/ratios
names=("$@")
[ ${#names[@]} -eq 0 ] && names=($(ls .samples/bin))
native_pass=0 pass=0
for n in "${names[@]}"; do
    # Each run's wall and CPU time, and the CPU the daemon and its workers
    # spent meanwhile (scripts/gpu/timed_run.py).
    run_both $n $W/logs/$n.native $W/logs/$n.standin
    ns=$(field wall "$nl"); ss=$(field wall "$sl")
    nv=$(verdict $W/logs/$n.native); sv=$(verdict $W/logs/$n.standin)
    if [ $nrc -eq 0 ]; then
        native_pass=$((native_pass + 1))
        if [ $src -eq 0 ] && [ "$nv" = "$sv" ]; then
            pass=$((pass + 1)); r=ok
        else
            r=DIFFERS
        fi
    else
        r="native rc=$nrc"
    fi
    ratio_n=$(awk -v s=$ss -v n=$ns 'BEGIN { printf "%.2f", s / n }')
    printf '%-26s native rc=%-3s stand-in rc=%-3s %-8s wall %7ss %7ss x%s  cpu %s %s  host %s %s\n' \
        "$n" "$nrc" "$src" "$r" "$ns" "$ss" "$ratio_n" "$(field cpu "$nl")" "$(field cpu "$sl")" \
        "$(field host_cpu "$nl")" "$(field host_cpu "$sl")"
    if [ "$r" = ok ] && awk -v x=$ratio_n 'BEGIN { exit !(x > 1.05) }'; then
        # Over 1.05: two more pairs, the stand-in first in the second, and
        # the median of each way's three walls counts.
        nw="$ns" sw="$ss"
        for k in 2 3; do
            TURNED=$([ $k = 2 ] && echo 1) run_both $n /dev/null /dev/null
            nw="$nw $(field wall "$nl")"; sw="$sw $(field wall "$sl")"
            echo "   again ($k): wall $(field wall "$nl")s $(field wall "$sl")s  cpu $(field cpu "$nl") $(field cpu "$sl")"
        done
        ns=$(median $nw); ss=$(median $sw)
        ratio_n=$(awk -v s=$ss -v n=$ns 'BEGIN { printf "%.2f", s / n }')
        echo "   median of three: wall ${ns}s ${ss}s x$ratio_n"
    fi
    [ "$r" = ok ] && echo "$n $ratio_n" >> $W/ratios
    o=$(own $W/logs/$n.native)
    [ -n "$o" ] && echo "   own timing: native: $o | stand-in: $(own $W/logs/$n.standin)"
    if [ "$r" = DIFFERS ]; then
        echo "   native:   $nv"; echo "   stand-in: $sv"
        tail -5 $W/logs/$n.standin | sed 's/^/   | /'
    fi
done
gf() { sed -n 's/.*Performance= *\([0-9.]*\) GFlop\/s.*/\1/p' "$1" | tail -1; }
ratio=missing
if [ -f $W/logs/matrixMul.native ]; then
    ratio=$(awk -v s="$(gf $W/logs/matrixMul.standin)" -v n="$(gf $W/logs/matrixMul.native)" \
        'BEGIN { if (n > 0 && s > 0) printf "%.3f", s / n; else print "missing" }')
    echo "matrixMul native: $(grep -a Performance $W/logs/matrixMul.native)"
    echo "matrixMul stand-in: $(grep -a Performance $W/logs/matrixMul.standin)"
fi
kill $D; wait $D 2>/dev/null
echo "== daemon warnings"; grep -aE 'WARN|ERROR' $W/logs/daemon.log | head -20
# matrixMul again, native and through the stand-in in turn, three times
# for each daemon setting in MODES (lines added to [daemon]; ';' for a
# newline).
MODES=${MODES-'graph_launches = "all"|graph_launches = "off"|slice_us = 100000|scheduler = false'}
if [ -d .samples/bin/matrixMul ] && [ -n "$MODES" ]; then
    echo "== matrixMul GFlop/s, native vs stand-in, by daemon setting"
    IFS='|' read -ra modes <<< "$MODES"
    m=0
    for mode in "${modes[@]}"; do
        m=$((m + 1))
        awk -v add="$mode" '{ print } /^executor = / { gsub(";", "\n", add); print add }' \
            $W/host.toml > $W/host-$m.toml
        rm -f $W/run/vm1.sock
        RUST_LOG=warn $R/fairvgpu serve --config $W/host-$m.toml 2>> $W/logs/daemon-modes.log &
        D=$!
        for i in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
        for k in 1 2 3; do
            nat=$(cd .samples/bin/matrixMul && LD_LIBRARY_PATH=$NV ./matrixMul 2>&1 | grep -a Performance)
            sti=$(cd .samples/bin/matrixMul && FAIRVGPU_SOCKET=$W/run/vm1.sock \
                LD_LIBRARY_PATH=$W/lib ./matrixMul 2>&1 | grep -a Performance)
            n=$(echo "$nat" | sed -n 's/.*Performance= *\([0-9.]*\) GFlop.*/\1/p')
            s=$(echo "$sti" | sed -n 's/.*Performance= *\([0-9.]*\) GFlop.*/\1/p')
            echo "[$mode] run $k: native $n stand-in $s ratio $(awk -v s="$s" -v n="$n" 'BEGIN { if (n > 0) printf "%.3f", s / n }')"
        done
        kill $D; wait $D 2>/dev/null
    done
fi
tar czf $OUT/conformance-logs.tgz -C $W logs
# Wall time through the stand-in over native, of the programs passing both
# ways: the slowest, and the geometric mean.
slow=$(sort -k2 -g $W/ratios | tail -1 | tr ' ' ':')
geo=$(awk '{ s += log($2); k++ } END { if (k) printf "%.3f", exp(s / k); else print "none" }' $W/ratios)
echo "samples_pass=$pass/$native_pass native_pass=$native_pass matrixmul_gflops_ratio=$ratio slowest=${slow:-none} geomean_ratio=$geo"
