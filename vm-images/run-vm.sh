#!/usr/bin/env bash
# Starts the test guest (vm-images/build.sh) under QEMU with a VM's vGPU
# attached to a running `fairvgpu serve`.
#
#   vm-images/run-vm.sh --config host.toml --vm NAME [options] [-- QEMU ARGS...]
#     --image DIR      kernel and initramfs (default target/vm)
#     --mode M         tests | hotplug | shell (default shell); see vm-images/init
#     --accel A        kvm | tcg (default: kvm where /dev/kvm is usable, else tcg)
#     --no-vgpu        start without the vGPU (to hot-plug it later with
#                      `fairvgpu attach --vm NAME --qmp SOCKET`)
#     --qmp SOCKET     serve QMP there
#     --smp N          vCPUs (default 2; keep <= the layout's vectors)
#     --fairvgpu BIN   the fairvgpu binary (default: target/release/fairvgpu)
#     --append WORDS   more of the kernel command line (fairvgpu.loop=US,SECS)
# The console is the terminal (serial); the guest powers off when its mode ends.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
image="$root/target/vm" mode=shell accel="" vgpu=1 qmp="" smp=2 config="" vm="" append=""
fairvgpu="${CARGO_TARGET_DIR:-$root/target}/release/fairvgpu"
while [ $# -gt 0 ]; do
    case "$1" in
    --config) config="$2"; shift 2 ;;
    --vm) vm="$2"; shift 2 ;;
    --image) image="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --accel) accel="$2"; shift 2 ;;
    --no-vgpu) vgpu=0; shift ;;
    --qmp) qmp="$2"; shift 2 ;;
    --smp) smp="$2"; shift 2 ;;
    --fairvgpu) fairvgpu="$2"; shift 2 ;;
    --append) append="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run-vm.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -n "$config" ] && [ -n "$vm" ] || { echo "run-vm.sh: --config and --vm are required" >&2; exit 2; }
[ -f "$image/vmlinuz" ] || { echo "run-vm.sh: no $image/vmlinuz; run vm-images/build.sh" >&2; exit 1; }
if [ -z "$accel" ]; then
    if [ -w /dev/kvm ]; then accel=kvm; else accel=tcg; fi
fi
args=(-machine pc -m 1024 -smp "$smp" -nodefaults -display none -no-reboot
      -serial stdio -kernel "$image/vmlinuz" -initrd "$image/initrd.img"
      -append "console=ttyS0 quiet panic=-1 fairvgpu.mode=$mode $append")
case "$accel" in
kvm) args+=(-enable-kvm -cpu host) ;;
tcg) args+=(-accel tcg) ;;
*) echo "run-vm.sh: --accel kvm or tcg" >&2; exit 2 ;;
esac
[ -n "$qmp" ] && args+=(-qmp "unix:$qmp,server=on,wait=off")
if [ "$vgpu" = 1 ]; then
    # shellcheck disable=SC2207 # the arguments are words without spaces
    args+=($("$fairvgpu" attach --config "$config" --vm "$vm" --print qemu))
fi
exec qemu-system-x86_64 "${args[@]}" "$@"
