#!/usr/bin/env bash
# On the GPU machine: what slot 7 of the driver's tools module table
# (6e163fbe) does (scripts/gpu/module_tools_probe.c, natively and through
# the stand-in), and cuFFT planning and running a 1D C2C transform
# (tests/c/cufft.c exec), natively and through the stand-in (daemon on the
# cuda executor).
# Carried: the release fairvgpu and libcuda.so (in target/release, or
# stripped in .carry/release with R=.carry/release).
# usage: scripts/gpu/cufft.sh
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-target/release}
W=/tmp/fvg-cufft; rm -rf $W; mkdir -p $W/lib $W/run
cp $R/libcuda.so $W/lib/libcuda.so.1
header
LIBS=""
for so in libcudart.so.13 libcufft.so.12; do
    f=$(find /usr/local /opt /usr/lib -name "$so" 2>/dev/null | head -1)
    [ -n "$f" ] && LIBS="$LIBS:$(dirname "$f")"
done
LIBS=${LIBS#:}
echo "== libraries: $LIBS"
nvcc -O2 -o $W/probe scripts/gpu/module_tools_probe.c -L$NV -lcuda || echo "probe build failed"
nvcc -O2 -o $W/cufft tests/c/cufft.c $(for d in ${LIBS//:/ }; do echo "-L$d -I$d/../include"; done) -lcufft || echo "cufft build failed"
echo "== slot 7, native"
timeout 30 $W/probe; echo "rc=$?"
for c in null-module bogus-module null-callback library-handle unloaded; do
    timeout 20 $W/probe $c 2>&1 | tail -3; echo "rc=$?"
done
echo "== cuFFT, native"
LD_LIBRARY_PATH=$NV:$LIBS timeout 60 $W/cufft exec; echo "rc=$?"
cat > $W/host.toml <<TOML
[daemon]
run_dir = "$W/run"
executor = "cuda"
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 8192
TOML
RUST_LOG=warn $R/fairvgpu serve --config $W/host.toml 2> $W/daemon.log &
D=$!
for i in $(seq 100); do [ -S $W/run/vm1.sock ] && break; sleep 0.1; done
export FAIRVGPU_SOCKET=$W/run/vm1.sock
echo "== cuFFT, stand-in"
FAIRVGPU_LIBCUDA_DEBUG=1 LD_LIBRARY_PATH=$W/lib:$LIBS timeout 60 $W/cufft exec; echo "rc=$?"
echo "== slot 7, stand-in"
LD_LIBRARY_PATH=$W/lib timeout 30 $W/probe; echo "rc=$?"
kill $D; wait $D 2>/dev/null
echo "== daemon warnings"; grep -aE 'WARN|ERROR' $W/daemon.log | head -20
