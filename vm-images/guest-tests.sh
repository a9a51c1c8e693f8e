#!/bin/sh
# The checks that run inside the test guest. Each prints "FVG-PASS name" or
# "FVG-FAIL name", followed by its output indented.

wait_for() { # wait_for SECONDS TEST...
    n=$(($1 * 10)); shift
    while [ $n -gt 0 ]; do
        if "$@"; then return 0; fi
        sleep 0.1; n=$((n - 1))
    done
    return 1
}

step() { # step NAME COMMAND...
    name=$1; shift
    if "$@" >/tmp/$name.log 2>&1; then echo "FVG-PASS $name"; else echo "FVG-FAIL $name"; fi
    sed "s/^/    $name: /" /tmp/$name.log
}

show_device() {
    d=/sys/class/fairvgpu/fairvgpu0
    echo "FVG device peer=$(cat $d/peer_id) vectors=$(cat $d/vectors) region=$(cat $d/region_size)"
}

# A process killed in the middle of streaming copies must get its channel and
# its device memory back to the host: the module marks the channel abandoned.
kill_mid_copy() {
    /fvg/test-guest /dev/fairvgpu0 64 >/tmp/tg.out 2>&1 &
    pid=$!
    wait_for 60 grep -q ready /tmp/tg.out || { cat /tmp/tg.out; return 1; }
    echo "FVG copying pid=$pid" >/dev/console
    # The host test answers on the console once it saw the memory held.
    read -t 20 ack </dev/console
    kill -9 $pid
    wait $pid 2>/dev/null
    echo "FVG killed" >/dev/console
    /fvg/vm-probe memfree 60 || return 1
    dmesg | grep "abandoned by an exiting process"
}

# Two processes waiting on the device at once (with process slots, each in
# a slot of its own, served by its own worker; each woken on its vCPU's
# vector, which the two share while on one vCPU).
two_at_once() {
    /fvg/vm-probe block 20 2 >/tmp/a.out 2>&1 &
    a=$!
    /fvg/vm-probe block 20 2 >/tmp/b.out 2>&1 &
    b=$!
    wait $a; ra=$?
    wait $b; rb=$?
    cat /tmp/a.out /tmp/b.out
    [ $ra -eq 0 ] && [ $rb -eq 0 ]
}

if [ "$1" = compute ]; then
    # A program that computes and checks in a loop, for a checkpoint or a
    # migration of its VM mid-loop (tests/tests/vm.rs): fairvgpu.rounds=N.
    rounds=$(sed -n 's/.*fairvgpu\.rounds=\([0-9]*\).*/\1/p' /proc/cmdline)
    /fvg/vm-probe compute "${rounds:-30}" || echo "FVG-FAIL compute"
    exit 0
fi

if [ "$1" = loop ]; then
    # A tenant's kernel loop for the host's fairness measurement
    # (scripts/vm-fairness.sh): fairvgpu.loop=US,SECS on the command line.
    spec=$(sed -n 's/.*fairvgpu\.loop=\([0-9]*,[0-9]*\).*/\1/p' /proc/cmdline)
    echo "FVG waiting for hot-plug"
    if wait_for 600 test -e /dev/fairvgpu0; then
        /fvg/vm-probe loop "${spec%,*}" "${spec#*,}" || echo "FVG-FAIL loop"
    else
        echo "FVG-FAIL hotplug"
    fi
    exit 0
fi

if [ "$1" = hotplug ]; then
    echo "FVG waiting for hot-plug"
    if wait_for 120 test -e /dev/fairvgpu0; then
        echo "FVG appeared"
        show_device
        step hotplug_driver_api /fvg/driver_api /fvg/fairvgpu.ptx
        echo "FVG waiting for unplug"
        if wait_for 120 sh -c '! test -e /dev/fairvgpu0'; then
            echo "FVG gone"
            sleep 2 # let the host finish its side of the unplug
        else
            echo "FVG-FAIL unplug"
        fi
    else
        echo "FVG-FAIL hotplug"
    fi
    exit 0
fi

if ! wait_for 30 test -e /dev/fairvgpu0; then
    echo "FVG-FAIL no /dev/fairvgpu0"
    exit 1
fi
show_device
step driver_api /fvg/driver_api /fvg/fairvgpu.ptx
step cudarc /fvg/cudarc-guest /fvg/fairvgpu.ptx
step blocking /fvg/vm-probe block 50
step two_at_once two_at_once
step kill_mid_copy kill_mid_copy
echo "FVG interrupts=$(cat /sys/class/fairvgpu/fairvgpu0/interrupts) wakeups=$(cat /sys/class/fairvgpu/fairvgpu0/wakeups)"
