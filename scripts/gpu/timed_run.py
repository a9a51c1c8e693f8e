#!/usr/bin/env python3
"""Runs one program and says what it cost: wall time, the program's own CPU
time (user + system, its children included) and the CPU the daemon's process
tree (the daemon and its workers) spent meanwhile.

usage: timed_run.py DAEMON_PID TIMEOUT_S OUTPUT_FILE PROGRAM [ARGS...]
  Runs PROGRAM in the current directory and environment, its output to
  OUTPUT_FILE; prints one line: `rc=N wall=S cpu=S host_cpu=S`. DAEMON_PID 0:
  no daemon to account (host_cpu=0). Exit status: the program's (124 when
  TIMEOUT_S passed and it was killed).
"""
import os
import resource
import subprocess
import sys
import time


def tree_cpu(root):
    """CPU seconds the process `root` and its children have spent so far."""
    if root <= 0:
        return 0.0
    pids = [root]
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == str(root):
                    pids.append(int(p))
        except (OSError, IndexError):
            pass
    ticks = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


def main():
    daemon, timeout, out, cmd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
    h0 = tree_cpu(daemon)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(out, "wb") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"rc={rc} wall={wall:.3f} cpu={cpu:.3f} host_cpu={tree_cpu(daemon) - h0:.3f}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
