#!/usr/bin/env python3
"""Fairness through real VMs (issue 32): `bench fairness`'s three guests, each
the one vCPU of a QEMU VM (vm-images/, TCG where KVM is not usable) running
`vm-probe loop` (a 20 us, 400 us or 1.6 ms kernel, launched and synchronized
again and again) on its vGPU of a `fairvgpu serve` with the sim executor,
weights 1:2:3, beside HOGS busy loops (other VMs' vCPUs). The vGPUs are
hot-plugged through QMP (`fairvgpu attach`), so the daemon knows each VM's
vCPU thread and the vCPU lift and the kick act on it as on any VM's.

Each VM runs alone first (its alone rate beside the same hogs), then the
three together; each guest prints its count every 250 ms on its serial
console, timed here as the lines come. Rates are taken over the window all
three ran in, less its first second. MMR is min/max over the VMs of their
share of the GPU time over their weight's share, as `bench fairness`
reports it; throughput is the sum of each VM's rate together over its rate
alone. Under TCG the guests' own code runs slowly, so the lightest guest's
loop is mostly the CPU's: the figures say how the host's CPU options hold a
VM's share, not how fast anything is.

usage: scripts/vm-fairness.py [--hogs N] [--seconds S] [--lift on|off]
           [--realtime] [--accel kvm|tcg] [--image DIR] [--fairvgpu BIN]
(--realtime: `[daemon] realtime = true`, the real-time lift besides the lifts.)
Needs a built fairvgpu (cargo build --release -p cli) and a guest image
(vm-images/build.sh). Last line:
    vms=3 hogs=N lift=on|off realtime=on|off vm_mmr=... vm_throughput=...
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS_US = [20, 400, 1600]
WEIGHTS = [1, 2, 3]
WARMUP_S = 1.0


def config(run_dir, lift, realtime):
    text = f'''[daemon]
run_dir = "{run_dir}"
executor = "sim"
priority = {-10 if lift else 0}
vcpu_lift = {"true" if lift else "false"}
realtime = {"true" if realtime else "false"}

[layout]
channels = 8
ring_entries = 64
arena_size = 1048576
vectors = 2
'''
    for g, w in enumerate(WEIGHTS):
        text += f'''
[[vm]]
name = "vm{g}"
tenant = "t{g}"
weight = {w}
memory_limit_mib = 512
'''
    return text


class Vm:
    """One guest VM: its QEMU process and its console's lines, timed."""

    def __init__(self, args, cfg, g, qmp):
        self.name = f"vm{g}"
        self.qmp = qmp
        self.lines = []
        self.samples = []  # (host time, count)
        self.waiting = threading.Event()
        cmd = [str(ROOT / "vm-images/run-vm.sh"), "--config", str(cfg),
               "--vm", self.name, "--image", str(args.image), "--mode", "loop",
               "--no-vgpu", "--qmp", str(qmp), "--smp", "1",
               "--fairvgpu", str(args.fairvgpu),
               "--append", f"fairvgpu.loop={KERNELS_US[g]},{args.seconds}"]
        if args.accel:
            cmd += ["--accel", args.accel]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True,
                                     errors="replace")
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            now = time.monotonic()
            line = line.rstrip("\r\n")
            self.lines.append(line)
            if "FVG waiting for hot-plug" in line:
                self.waiting.set()
            elif line.startswith("FVG-LOOP "):
                self.samples.append((now, int(line.split()[1])))

    def count_at(self, t):
        """The count at host time t, between the samples around it."""
        s = self.samples
        for (t0, c0), (t1, c1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        raise ValueError(f"{self.name}: no samples around {t}")

    def rate(self, a, b):
        return (self.count_at(b) - self.count_at(a)) / (b - a)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run(args, cfg, tmp, which):
    """Boots the VMs `which`, hot-plugs their vGPUs once all wait, and waits
    for their loops to end; the VMs."""
    vms = [Vm(args, cfg, g, tmp / f"qmp{g}.sock") for g in which]
    try:
        for vm in vms:
            if not vm.waiting.wait(600):
                sys.exit(f"{vm.name} did not boot:\n" + "\n".join(vm.lines[-20:]))
        for vm in vms:
            out = subprocess.run([str(args.fairvgpu), "attach", "--config", str(cfg),
                                  "--vm", vm.name, "--qmp", str(vm.qmp)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"attach {vm.name}: {out.stdout}{out.stderr}")
        for vm in vms:
            vm.proc.wait(timeout=args.seconds + 600)
            vm.reader.join(10)
            if "FVG-FAIL" in "\n".join(vm.lines) or len(vm.samples) < 4:
                sys.exit(f"{vm.name} failed:\n" + "\n".join(vm.lines[-20:]))
    finally:
        for vm in vms:
            vm.kill()
    return vms


def window(vms):
    a = max(vm.samples[0][0] for vm in vms) + WARMUP_S
    b = min(vm.samples[-1][0] for vm in vms)
    if b - a < 1.0:
        sys.exit(f"the VMs ran together for {b - a:.1f} s only")
    return a, b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hogs", type=int, default=2)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--lift", choices=["on", "off"], default="on")
    p.add_argument("--realtime", action="store_true")
    p.add_argument("--accel", choices=["kvm", "tcg"])
    p.add_argument("--image", type=Path, default=ROOT / "target/vm")
    p.add_argument("--fairvgpu", type=Path, default=ROOT / "target/release/fairvgpu")
    args = p.parse_args()
    if args.realtime and args.lift == "off":
        sys.exit("--realtime needs the lifts (--lift on)")
    if not (args.image / "vmlinuz").exists():
        sys.exit(f"no guest image in {args.image}: run vm-images/build.sh")
    tmp = Path(tempfile.mkdtemp(prefix="fvg-vm-fairness-"))
    cfg = tmp / "host.toml"
    cfg.write_text(config(tmp / "run", args.lift == "on", args.realtime))
    log = open(tmp / "daemon.log", "w")
    daemon = subprocess.Popen([str(args.fairvgpu), "serve", "--config", str(cfg)],
                              stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, RUST_LOG="warn"))
    hogs = []
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "run/api.sock").exists():
            if time.monotonic() > deadline or daemon.poll() is not None:
                sys.exit(f"the daemon did not start: {(tmp / 'daemon.log').read_text()}")
            time.sleep(0.1)
        status = subprocess.run([str(args.fairvgpu), "status", "--config", str(cfg)],
                                capture_output=True, text=True).stdout
        for line in status.splitlines():
            if "lift:" in line:
                print(f"daemon: {line}")
        hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
                for _ in range(args.hogs)]
        print(f"{args.hogs} busy loops on {os.cpu_count()} CPUs; lifts {args.lift}; "
              f"{args.seconds} s loops; work in {tmp}")
        alone = []
        for g in range(3):
            (vm,) = run(args, cfg, tmp, [g])
            a, b = window([vm])
            alone.append(vm.rate(a, b))
            print(f"vm{g} alone: {alone[-1]:.1f} kernels/s over {b - a:.1f} s")
        vms = run(args, cfg, tmp, [0, 1, 2])
        a, b = window(vms)
        shared = [vm.rate(a, b) for vm in vms]
        gpu = [r * k for r, k in zip(shared, KERNELS_US)]
        share = [x / sum(gpu) for x in gpu]
        fair = [w / sum(WEIGHTS) for w in WEIGHTS]
        ratio = [s / f for s, f in zip(share, fair)]
        mmr = min(ratio) / max(ratio)
        throughput = sum(s / al for s, al in zip(shared, alone))
        print(f"together over {b - a:.1f} s:")
        print("vm  weight  kernel_us  alone/s  together/s  share   fair")
        for g in range(3):
            print(f"vm{g}  {WEIGHTS[g]:>5}  {KERNELS_US[g]:>9}  {alone[g]:>7.1f}"
                  f"  {shared[g]:>10.1f}  {share[g]:.3f}  {fair[g]:.3f}")
        rt = "on" if args.realtime else "off"
        print(f"vms=3 hogs={args.hogs} lift={args.lift} realtime={rt} vm_mmr={mmr:.3f} "
              f"vm_throughput={throughput:.3f}")
    finally:
        for h in hogs:
            h.kill()
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()


if __name__ == "__main__":
    main()
