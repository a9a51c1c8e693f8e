#!/usr/bin/env bash
# Builds a bootable test guest from Debian packages: a Debian kernel and a
# small initramfs holding busybox, the glibc the guest programs need, the
# fairvgpu kernel module, the guest library as libcuda.so.1 and test programs.
#
#   vm-images/build.sh [OUT]          (default OUT: target/vm)
#
# Environment (all optional):
#   KVER      Debian kernel ABI, e.g. 6.1.0-56-amd64 (default: the newest
#             installed linux-headers-*-amd64; the same ABI is downloaded as
#             the guest kernel, so module and kernel always match)
#   LIBCUDA   the stand-in library (default: a release build of libcuda)
#   GUEST_BIN folder with the Rust guest programs cudarc-guest, test-guest and
#             vm-probe (default: a release build of tests)
#
# Produces OUT/vmlinuz, OUT/initrd.img and OUT/kver. Start it with
# vm-images/run-vm.sh. Needs: linux-headers-amd64, busybox-static, gcc, cpio.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$root/target/vm}")"
cache="${FAIRVGPU_VM_CACHE:-$root/target/vm-cache}"
mkdir -p "$out" "$cache"

need_pkgs=()
command -v busybox >/dev/null || need_pkgs+=(busybox-static)
command -v cpio >/dev/null || need_pkgs+=(cpio)
ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1 || need_pkgs+=(linux-headers-amd64)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "vm-images: installing ${need_pkgs[*]}" >&2
    sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
    sudo_ apt-get update -qq
    # Quiet unless it fails (apt says "debconf: delaying package
    # configuration" on every install without apt-utils).
    DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" \
        >/tmp/fairvgpu-apt.log 2>&1 || { cat /tmp/fairvgpu-apt.log >&2; exit 1; }
fi
busybox="$(command -v busybox)"
if ldd "$busybox" >/dev/null 2>&1; then
    echo "vm-images: $busybox is dynamically linked; install busybox-static" >&2
    exit 1
fi

if [ -z "${KVER:-}" ]; then
    KVER="$(ls -d /usr/src/linux-headers-*-amd64 | sed 's|.*/linux-headers-||' | sort -V | tail -1)"
fi
echo "vm-images: guest kernel $KVER" >&2

# The kernel: Debian's package of the same ABI, unpacked (not installed).
if [ ! -f "$cache/vmlinuz-$KVER" ]; then
    fetch() {
        (cd "$cache" && rm -f linux-image-*.deb &&
            { apt-get download -qq "linux-image-$KVER" >/dev/null 2>&1 ||
              apt-get download -qq "linux-image-$KVER-unsigned" >/dev/null 2>&1; })
    }
    if ! fetch; then
        # Stale package lists on a long-lived machine.
        if [ "$(id -u)" = 0 ]; then apt-get update -qq; else sudo apt-get update -qq; fi
        fetch || { echo "vm-images: cannot download linux-image-$KVER" >&2; exit 1; }
    fi
    rm -rf "$cache/deb" && dpkg-deb -x "$cache"/linux-image-*.deb "$cache/deb"
    cp "$cache/deb/boot/vmlinuz-$KVER" "$cache/vmlinuz-$KVER"
    rm -rf "$cache/deb" "$cache"/linux-image-*.deb
fi

# The module, warning-free with W=1.
make -s -C "$root/kmod-shim" KVER="$KVER" check >/dev/null

# The guest library and programs.
if [ -z "${LIBCUDA:-}" ] || [ -z "${GUEST_BIN:-}" ]; then
    (cd "$root" && cargo build --release -q -p libcuda -p tests --bins --lib)
fi
tdir="${CARGO_TARGET_DIR:-$root/target}/release"
LIBCUDA="${LIBCUDA:-$tdir/libcuda.so}"
GUEST_BIN="${GUEST_BIN:-$tdir}"

stage="$(mktemp -d "$cache/stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,etc,proc,sys,dev,tmp,run,lib,lib64,usr/lib/fairvgpu,fvg}
cp "$busybox" "$stage/bin/busybox"
cp "$root/kmod-shim/fairvgpu_shim.ko" "$stage/lib/"
cp "$LIBCUDA" "$stage/usr/lib/fairvgpu/libcuda.so.1"
ln -s libcuda.so.1 "$stage/usr/lib/fairvgpu/libcuda.so"
cp "$root/worker/kernels/fairvgpu.ptx" "$stage/fvg/"
for b in cudarc-guest test-guest vm-probe; do
    cp "$GUEST_BIN/$b" "$stage/fvg/"
done
gcc -O2 -o "$stage/fvg/driver_api" "$root/tests/c/driver_api.c" \
    -L"$stage/usr/lib/fairvgpu" -lcuda -lm
cp "$root/vm-images/init" "$stage/init"
cp "$root/vm-images/guest-tests.sh" "$stage/fvg/"
chmod +x "$stage/init" "$stage/fvg/guest-tests.sh"

# The C library and whatever else the programs link (same Debian release).
for f in "$stage"/fvg/* "$stage/usr/lib/fairvgpu/libcuda.so.1"; do
    [ -x "$f" ] || [ "${f##*.}" = 1 ] || continue
    { LD_LIBRARY_PATH="$stage/usr/lib/fairvgpu" ldd "$f" 2>/dev/null || true; } | awk '/=> \// {print $3} /^\t\/lib64/ {print $1}'
done | sort -u | while read -r lib; do
    case "$lib" in "$stage"/*) continue ;; esac
    mkdir -p "$stage$(dirname "$lib")"
    cp -L "$lib" "$stage$lib"
done

(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initrd.img"
cp "$cache/vmlinuz-$KVER" "$out/vmlinuz"
echo "$KVER" >"$out/kver"
echo "vm-images: $out/vmlinuz $out/initrd.img ($(du -h "$out/initrd.img" | cut -f1))" >&2
