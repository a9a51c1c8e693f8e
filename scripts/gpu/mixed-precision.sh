#!/usr/bin/env bash
# On the GPU machine: fp16/bf16 products and autocast training natively and
# through the stand-in (daemon on the cuda executor), the driver's cluster
# table slot by slot (cluster_table_probe.c), and what the driver does with
# kernel printf and sticky faults in a process of several contexts
# (fault_printf_probe.cu). Carried: fairvgpu and libcuda.so in $R.
# A run through the stand-in that dies by a signal is run again under
# cuda-gdb for its backtrace, and with every driver call traced.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
W=/tmp/fvg-amp; rm -rf $W; mkdir -p $W/lib $W/bin
cp $R/libcuda.so $W/lib/libcuda.so.1
header
echo "== the driver's cluster table"
nvcc -O2 -Iscripts/gpu -o $W/bin/cluster scripts/gpu/cluster_table_probe.c -L$NV -lcuda && $W/bin/cluster
echo "== printf and sticky faults, natively, several contexts in one process"
nvcc -O2 -arch=sm_90 -cubin -o $W/bin/k.cubin scripts/gpu/fault_printf_probe.cu &&
nvcc -O2 -arch=sm_90 -o $W/bin/fp scripts/gpu/fault_printf_probe.cu -L$NV -lcuda || echo "build failed"
$W/bin/fp $W/bin/k.cubin printf > $W/printf.out 2> $W/printf.err; echo "printf rc=$?"; cat $W/printf.out; sed 's/^/stderr: /' $W/printf.err
for k in assert trap read; do
  $W/bin/fp $W/bin/k.cubin $k > $W/$k.out 2> $W/$k.err; echo "$k rc=$?"; cat $W/$k.out; sed "s/^/stderr: /" $W/$k.err
done
daemon_start $W 40960
export PYTHONUNBUFFERED=1
for m in ${AMP_MODES:-torch_mm torch_amp cupy jax}; do
  extra=""; [ $m = jax ] && extra="XLA_PYTHON_CLIENT_PREALLOCATE=false"
  env $extra timeout 120 python3 scripts/gpu/amp_check.py $m > $W/$m.native 2>&1; nrc=$?
  env $extra FAIRVGPU_LIBCUDA_DEBUG=1 LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 120 \
      python3 scripts/gpu/amp_check.py $m > $W/$m.standin 2>&1; src=$?
  echo "== $m: native rc=$nrc stand-in rc=$src"
  paste -d'|' <(grep -E '^[a-z_0-9]+ ' $W/$m.native) <(grep -E '^[a-z_0-9]+ ' $W/$m.standin)
  grep -a 'fairvgpu libcuda' $W/$m.standin | sort | uniq -c | head -20
  if [ $src -ne 0 ]; then
    tail -8 $W/$m.standin | sed 's/^/   | /'
    env $extra FAIRVGPU_LIBCUDA_TRACE=1 LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH timeout 120 \
      python3 scripts/gpu/amp_check.py $m > $W/$m.trace 2>&1
    echo "   last calls:"; grep -a 'fairvgpu libcuda' $W/$m.trace | tail -25 | sed 's/^/   | /'
    if [ $src -gt 128 ] && [ $src -ne 124 ]; then
      echo "   backtrace:"
      env $extra timeout 300 cuda-gdb -batch -ex "set environment LD_LIBRARY_PATH=$W/lib:$LD_LIBRARY_PATH" \
        -ex run -ex bt -ex 'info registers rip' -ex 'x/6i $pc' --args python3 scripts/gpu/amp_check.py $m 2>&1 |
        grep -v '^\[New Thread\|^\[Thread' | tail -40 | sed 's/^/   | /'
    fi
  fi
done
grep -c 'kernel [0-9] thread' $W/logs/daemon.log | sed 's/^/daemon log lines of kernel printf: /'
daemon_stop
