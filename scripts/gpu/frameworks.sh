#!/usr/bin/env bash
# On the GPU machine: PyTorch, CuPy and JAX checks (scripts/gpu/frameworks.py)
# natively and through the stand-in (daemon on the cuda executor), in the
# same call; compares the values each prints. Carried: the release
# fairvgpu and libcuda.so in $R (default .carry/release).
# Then two VMs at weights 1:2 train a larger transformer at once (shared_mmr).
# FW_LIST picks the frameworks (default "torch amp cupy jax"; amp: fp16 and
# bf16 products, the CNN and the transformer under bf16 autocast and under
# fp16 autocast with GradScaler, every step's loss), FW_SHARE=0 skips
# the two-VM run, FW_COMPILE=1 adds torch.compile of the transformer,
# FW_TIMEOUT sets each run's time limit (default 90 s natively, 60 s through
# the stand-in).
# torch_step_ratio is the median of three paired runs of the transformer's
# step, native and through the stand-in in turn (each run's own median of
# five blocks); step_ratio_runs lists the three.
# Last line: torch_ok=… cupy_ok=… jax_ok=… torch_step_ratio=… torch_startup_ratio=…
# shared_mmr=…
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-fw; rm -rf $W; mkdir -p $W/lib $W/run $W/logs
cp $R/libcuda.so $W/lib/libcuda.so.1
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 40960
[[vm]]
name = "vm2"
tenant = "u"
weight = 2.0
memory_limit_mib = 20480
TOML
header
RUST_LOG=warn $R/fairvgpu serve --config $W/host.toml 2> $W/logs/daemon.log &
D=$!
for i in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
export PYTHONUNBUFFERED=1
# Warm the page cache and the GPU first, so that neither side's timings
# pay for the machine's first run.
FWS=${FW_LIST:-torch amp cupy jax}
mods=$(echo $FWS | tr ' ' '\n' | grep -vx amp | paste -sd,)
timeout 120 python3 -c "import $mods; import torch; torch.zeros(1, device='cuda')" > /dev/null 2>&1
declare -A ok
for fw in $FWS; do
    extra=""
    [ $fw = jax ] && extra="XLA_PYTHON_CLIENT_PREALLOCATE=false"
    env $extra timeout ${FW_TIMEOUT:-90} python3 scripts/gpu/frameworks.py $fw > $W/logs/$fw.native 2>&1
    nrc=$?
    env $extra FAIRVGPU_LIBCUDA_DEBUG=1 FAIRVGPU_SOCKET=$W/run/vm1.sock \
        LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout ${FW_TIMEOUT:-60} \
        python3 scripts/gpu/frameworks.py $fw > $W/logs/$fw.standin 2>&1
    src=$?
    # Same names, values within 1e-5 relative.
    if [ $nrc -eq 0 ] && [ $src -eq 0 ] &&
       python3 scripts/gpu/frameworks.py compare $W/logs/$fw.native $W/logs/$fw.standin; then
        ok[$fw]=1
    else
        ok[$fw]=0
    fi
    echo "== $fw: native rc=$nrc, stand-in rc=$src, same values: ${ok[$fw]}"
    paste <(grep -E '^[a-z_]+ ' $W/logs/$fw.native) <(grep -E '^[a-z_]+ ' $W/logs/$fw.standin) | head -20
    if [ $src -ne 0 ]; then
        tail -25 $W/logs/$fw.standin | sed 's/^/   | /'
        # Again with every call traced: the calls that did not succeed.
        env $extra FAIRVGPU_LIBCUDA_TRACE=1 FAIRVGPU_SOCKET=$W/run/vm1.sock \
            LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 40 \
            python3 scripts/gpu/frameworks.py $fw > $W/logs/$fw.trace 2>&1
        echo "   calls that failed (count, call -> result):"
        grep -a '^fairvgpu libcuda: cu.* -> [1-9]' $W/logs/$fw.trace | sort | uniq -c | sort -rn | head -15
    fi
done
t() { sed -n "s/^time_ms $2 //p" $W/logs/$1 | tail -1; }
ratio() { awk -v s="$1" -v n="$2" 'BEGIN { if (n > 0 && s > 0) printf "%.3f", s / n; else print "missing" }'; }
# The transformer's step, three times each way in turn (the machine's
# drift shows in the spread of the three ratios).
runs=""
if [[ " $FWS " == *" torch "* ]]; then
    echo "== transformer step, native and through the stand-in in turn"
    for k in 1 2 3; do
        timeout 60 python3 scripts/gpu/frameworks.py torch-times > $W/logs/times.native.$k 2>&1
        FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 60 \
            python3 scripts/gpu/frameworks.py torch-times > $W/logs/times.standin.$k 2>&1
        n=$(t times.native.$k transformer_step_median); s=$(t times.standin.$k transformer_step_median)
        r=$(ratio "$s" "$n")
        echo "run $k: native $n ms, stand-in $s ms a step: $r"
        runs="$runs $r"
    done
fi
median() { tr ' ' '\n' | grep -v '^missing$' | grep . | sort -n |
    awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "missing" }'; }
step_ratio=$(echo $runs | median)
# The same under bf16 autocast.
amp_runs=""
if [[ " $FWS " == *" amp "* ]]; then
    echo "== transformer step under bf16 autocast, native and through the stand-in in turn"
    for k in 1 2 3; do
        timeout 60 python3 scripts/gpu/frameworks.py torch-times amp > $W/logs/amptimes.native.$k 2>&1
        FAIRVGPU_SOCKET=$W/run/vm1.sock LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 60 \
            python3 scripts/gpu/frameworks.py torch-times amp > $W/logs/amptimes.standin.$k 2>&1
        n=$(t amptimes.native.$k transformer_step_median); s=$(t amptimes.standin.$k transformer_step_median)
        r=$(ratio "$s" "$n")
        echo "run $k: native $n ms, stand-in $s ms a step: $r"
        amp_runs="$amp_runs $r"
    done
fi
amp_step_ratio=$(echo $amp_runs | median)
shared_mmr=skipped
if [ "${FW_SHARE:-1}" = 1 ]; then
# Two VMs at once, weights 1:2, both training the large transformer for
# 15 s from the same moment: steps against the weights, and each one's
# checked values (a loss, a parameter sum) against the same training run
# natively alone.
timeout 120 python3 scripts/gpu/frameworks.py share-ref > $W/logs/share.ref 2>&1
start=$(( $(date +%s) + 10 ))
P=""
for vm in vm1 vm2; do
    FAIRVGPU_SOCKET=$W/run/$vm.sock LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 60 \
        python3 scripts/gpu/frameworks.py share $start 15 > $W/logs/share.$vm 2>&1 &
    P="$P $!"
done
wait $P
s1=$(sed -n 's/^share_steps //p' $W/logs/share.vm1); s2=$(sed -n 's/^share_steps //p' $W/logs/share.vm2)
echo "== two VMs, weights 1:2: steps $s1 / $s2 (alone: $(sed -n 's/^time_ms share_step //p' $W/logs/share.ref) ms a step);" \
     "checked values: alone $(grep -h '^share_[lp]' $W/logs/share.ref | paste -sd' ')," \
     "vm1 $(grep -h '^share_[lp]' $W/logs/share.vm1 | paste -sd' ')," \
     "vm2 $(grep -h '^share_[lp]' $W/logs/share.vm2 | paste -sd' ')"
shared_ok=1
grep -h '^share_[lp]' $W/logs/share.ref > $W/logs/share.want
for vm in vm1 vm2; do
    grep -h '^share_[lp]' $W/logs/share.$vm > $W/logs/share.got
    python3 scripts/gpu/frameworks.py compare $W/logs/share.want $W/logs/share.got || shared_ok=0
done
shared_mmr=$(awk -v a="${s1:-0}" -v b="${s2:-0}" 'BEGIN {
    if (a <= 0 || b <= 0) { print "missing"; exit }
    x = (a / (a + b)) / (1 / 3); y = (b / (a + b)) / (2 / 3)
    printf "%.3f", (x < y ? x / y : y / x) }')
[ $shared_ok = 1 ] || shared_mmr="${shared_mmr}(losses_differ)"
fi
kill $D; wait $D 2>/dev/null
echo "== daemon warnings"; grep -aE 'WARN|ERROR' $W/logs/daemon.log | head -20
tar czf $OUT/frameworks-logs.tgz -C $W logs
echo "torch_ok=${ok[torch]:-skipped} cupy_ok=${ok[cupy]:-skipped} jax_ok=${ok[jax]:-skipped}" \
     "amp_ok=${ok[amp]:-skipped}" \
     "torch_step_ratio=$step_ratio step_ratio_runs=$(echo $runs | tr ' ' ',')" \
     "amp_step_ratio=$amp_step_ratio amp_ratio_runs=$(echo $amp_runs | tr ' ' ',')" \
     "torch_startup_ratio=$(ratio "$(t torch.standin startup)" "$(t torch.native startup)")" \
     "cnn_step_ratio=$(ratio "$(t torch.standin cnn_step)" "$(t torch.native cnn_step)")" \
     "shared_mmr=$shared_mmr"
