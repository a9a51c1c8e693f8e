# Sourced by the GPU scripts: the driver's library path, $OUT (what comes
# back from the device machine), and what several of them do.
NV=/usr/local/nvidia/lib64
export LD_LIBRARY_PATH=$NV
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"

# The lines every log starts with: when, and on which GPU and driver.
header() {
  echo "== date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}

# Builds NVIDIA's cuda-samples from .carry/upstream.tar.xz into .samples
# (kept for later calls on the same machine; REBUILD=1 to redo it), the
# build's log in $OUT/build.log.
samples_build() {
  local u=/tmp/fvg-upstream
  if [ ! -d .samples/bin ] || [ -n "${REBUILD:-}" ]; then
    rm -rf "$u" .samples; mkdir -p "$u"
    tar xJf .carry/upstream.tar.xz -C "$u" || return 1
    echo "== cuda-samples $(cat $u/COMMIT), built with $(nvcc --version | tail -2 | head -1)"
    python3 scripts/gpu/build_upstream.py "$u" .samples > $OUT/build.log 2>&1
    grep 'not built' $OUT/build.log | cut -c1-160
    tail -1 $OUT/build.log
  fi
}

# From the output $1 of a `bench fairness --hogs` run, its summary: the
# last line, the idle releases and the lightest guest's share beside the
# hogs (fair: 0.167) and what it was charged against its device time, and
# the holders' waits for late guests (with their part waiting for a CPU).
fairness_summary() {
  local share idle late charged
  share=$(grep -a -m1 "^fairvgpu  *0 " "$1" | awk '{print $6}')
  idle=$(grep -a -m1 -o 'idle_releases=[0-9]*' "$1")
  charged=$(grep -a -m1 "^charged by the grant service" "$1" |
    grep -o 'guest 0 [0-9.]* ([0-9.]*' | awk '{print $4}' | tr -d '(')
  late=$(grep -a -m1 "^all: grants" "$1" |
    grep -o 'late_guests [0-9]* ([0-9.]* us each)\( waiting_for_cpu [0-9.]* us each\)\?')
  echo "$(tail -1 "$1") $idle guest0_share=${share:--} guest0_charged=${charged:--} $late"
}

# Builds against each other: `$b/fairvgpu ARGS...` for each directory b in
# $BUILDS (an entry `dir+--flag` runs dir's binary with `--flag` last), $1 rounds, the order reversed every other round. Each run's output
# is appended to the log $2, and a line per run (to the log and stdout)
# names the build, its exit status and what `$3 OUTPUT` makes of its output.
# usage: alternate_builds ROUNDS LOG SUMMARY ARGS...
alternate_builds() {
  local rounds=$1 log=$2 summary=$3 round order b rc dir extra
  shift 3
  for round in $(seq "$rounds"); do
    order=$BUILDS
    [ $((round % 2)) -eq 0 ] && order=$(echo "$BUILDS" | tr ' ' '\n' | tac | tr '\n' ' ')
    for b in $order; do
      # A build "dir+--flag" runs dir's binary with --flag after the rest.
      dir=${b%%+*} extra=""
      [ "$dir" != "$b" ] && extra=${b#*+}
      echo "== round $round: $dir/fairvgpu $* $extra" >> "$log"
      # shellcheck disable=SC2086 # the extra flags split at spaces
      RUST_LOG=warn timeout 300 "$dir/fairvgpu" "$@" $extra > "$OUT/run.txt" 2>&1
      rc=$?
      cat "$OUT/run.txt" >> "$log"
      echo "$b rc=$rc $("$summary" "$OUT/run.txt")" | tee -a "$log"
    done
  done
  rm -f "$OUT/run.txt"
}

# The last line of the output $1.
last_line() { tail -1 "$1"; }

# Starts $1 busy-loop processes (a noisy host) until hogs_stop.
hogs_start() {
  echo "== $1 busy-loop processes on $(nproc) CPUs"
  HOG_PIDS=""
  for _ in $(seq "$1"); do sh -c 'while :; do :; done' & HOG_PIDS="$HOG_PIDS $!"; done
}

hogs_stop() {
  kill $HOG_PIDS
  wait $HOG_PIDS 2>/dev/null
}

# Builds scripts/gpu/$1.c with nvcc into $2/$1 and runs it with the rest
# of the arguments.
probe() {
  local name=$1 dir=$2; shift 2
  rm -rf "$dir"; mkdir -p "$dir"
  header
  nvcc -O2 -o "$dir/$name" "scripts/gpu/$name.c" -L$NV -lcuda && echo built
  "$dir/$name" "$@"; echo "rc=$?"
}

# Starts the daemon ($R/fairvgpu) on the cuda executor (and the keys in
# $DAEMON_KEYS) with one VM, vm1, of $2 MiB (and the keys in $VM_KEYS), its
# run folder and log (logs/daemon.log, at $DAEMON_LOG, default info) under
# $1, and waits for the VM's socket; D is its pid and FAIRVGPU_SOCKET is
# exported.
daemon_start() {
  local w=$1 mib=$2
  mkdir -p "$w/run" "$w/logs"
  cat > "$w/host.toml" <<TOML
[daemon]
run_dir = "$w/run"
executor = "cuda"
${DAEMON_KEYS:-}
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = $mib
${VM_KEYS:-}
TOML
  RUST_LOG=${DAEMON_LOG:-info} "$R/fairvgpu" serve --config "$w/host.toml" 2> "$w/logs/daemon.log" &
  D=$!
  for _ in $(seq 200); do [ -S "$w/run/vm1.sock" ] && break; sleep 0.1; done
  export FAIRVGPU_SOCKET=$w/run/vm1.sock
}

# Stops the daemon daemon_start started.
daemon_stop() {
  unset FAIRVGPU_SOCKET
  kill "$D"; wait "$D" 2>/dev/null
}

# Waits while process $P runs until the progress file $W/progress
# (scripts/gpu/migrate_torch.py's) says phase $1 reached step $2, or the
# bf16 phase began when waiting on fp32.
wait_progress() {
  local phase=$1 step=$2 ph i
  while kill -0 "$P" 2>/dev/null; do
    if [ -f "$W/progress" ] && read -r ph i < "$W/progress" 2>/dev/null &&
       { [ "$ph" = "$phase" ] && [ "$i" -ge "$step" ] || { [ "$phase" = fp32 ] && [ "$ph" = bf16 ]; }; }; then
      return
    fi
    sleep 0.02
  done
}
