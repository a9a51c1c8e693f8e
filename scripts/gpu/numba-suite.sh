#!/usr/bin/env bash
# On the GPU machine: Numba's CUDA driver test suite (numba.cuda.tests.cudadrv)
# natively and through the stand-in (daemon on the cuda executor, one VM of
# 8 GiB), test by test. Last line:
#   numba_pass=N/M native_pass=M differs=NAME,...
# Carried: the release fairvgpu and libcuda.so (R=.carry/release).
# usage: R=.carry/release scripts/gpu/numba-suite.sh [TEST MODULE...]
#   NUMBA_PAR=N: numba's runner in N processes (`-m N`; through the stand-in
#   at most a VM's process_slots at once). ONLY=native, then ONLY=standin in
#   a later call on the same machine: one side per call, compared at the
#   second.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-target/release}
W=/tmp/fvg-numba
[ "${ONLY:-}" = standin ] || rm -rf $W
mkdir -p $W/lib $W/py
cp $R/libcuda.so $W/lib/libcuda.so.1
# Numba there needs numpy's row_stack, gone from numpy 2.x.
echo 'import numpy as np; np.row_stack = np.vstack' > $W/py/sitecustomize.py
# numba.cuda.testing imports the `filecheck` package, which only the tests
# that check generated code use; where the machine lacks it, a stand-in
# whose every use fails (those tests then fail both ways alike).
if ! python3 -c "import filecheck" 2>/dev/null; then
    mkdir -p $W/py/filecheck
    cat > $W/py/filecheck/__init__.py <<'PY'
class _Missing:
    def __init__(self, *a, **k):
        raise RuntimeError("the filecheck package is not installed")
    @classmethod
    def from_opts(cls, *a, **k):
        raise RuntimeError("the filecheck package is not installed")
def pattern_for_opts(*a, **k):
    raise RuntimeError("the filecheck package is not installed")
parse_argv_options = pattern_for_opts
Matcher = Options = Parser = FInput = _Missing
PY
    for m in matcher options parser finput; do
        echo 'from filecheck import *' > $W/py/filecheck/$m.py
    done
    echo "filecheck: not installed here, a stand-in that fails when used"
fi
mods=("$@"); [ ${#mods[@]} -eq 0 ] && mods=(numba.cuda.tests.cudadrv)
header
python3 -c "import numba, numba.cuda; print('numba', numba.__version__)" 2>&1 | tail -1
run() {  # label, then env assignments
    local label=$1; shift
    env "$@" PYTHONPATH=$W/py timeout ${NUMBA_TIMEOUT:-540} python3 -m numba.runtests -v \
        ${NUMBA_PAR:+-m $NUMBA_PAR} "${mods[@]}" \
        > $W/$label.log 2>&1
    echo "-- $label: rc=$? $(grep -aE '^(Ran|OK|FAILED)' $W/$label.log | tr '\n' ' ')"
    # One line per test: "name outcome".
    grep -aE '^test\w* \(.*\) \.\.\. ' $W/$label.log |
        sed -E 's/^(test\w*) \(([^)]*)\).*\.\.\. *(ok|FAIL|ERROR|skipped|expected failure|unexpected success).*/\2.\1 \3/' |
        sort > $W/$label.txt
}
[ "${ONLY:-}" = standin ] || run native LD_LIBRARY_PATH=$NV
[ "${ONLY:-}" = native ] && exit 0
daemon_start $W 8192
run standin LD_LIBRARY_PATH=$W/lib FAIRVGPU_SOCKET=$FAIRVGPU_SOCKET
daemon_stop
join -a1 -a2 -e missing -o 0,1.2,2.2 $W/native.txt $W/standin.txt > $W/both.txt
native_pass=$(awk '$2 == "ok"' $W/both.txt | wc -l)
pass=$(awk '$2 == "ok" && $3 == "ok"' $W/both.txt | wc -l)
echo "== tests whose outcome differs (native, stand-in)"
awk '$2 != $3' $W/both.txt
echo "== why, through the stand-in"
for t in $(awk '$2 == "ok" && $3 != "ok" { print $1 }' $W/both.txt); do
    echo "-- $t"
    grep -a -A12 "^[A-Z]*: ${t##*.} " $W/standin.log | tail -10 | cut -c1-200
done
echo "== daemon warnings"; grep -aE 'WARN|ERROR' $W/logs/daemon.log | cut -c1-200 | head -10
tar czf $OUT/numba-logs.tgz -C $W native.log standin.log both.txt logs
differs=$(awk '$2 == "ok" && $3 != "ok" { print $1 }' $W/both.txt | sed 's/.*\.//' | paste -sd,)
echo "numba_pass=$pass/$native_pass native_pass=$native_pass differs=${differs:-none}"
