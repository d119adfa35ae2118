#!/bin/bash
# prepare.sh - builds (once) what tests/softroce/vm.sh boots: a stock Debian
# kernel that has the Soft-RoCE driver (rdma_rxe) and a small initramfs.
# Nothing is installed on the host and nothing is written into the repository:
# the kernel .deb is fetched with `apt-get download` and unpacked with dpkg -x
# into the cache folder. Idempotent; about 0.1 s when the cache is complete.
#
# Prints KVER=, KERNEL=, INITRD= lines (for eval) on stdout.
# Environment:
#   VRPC_SOFTROCE_CACHE  cache folder (default ${XDG_CACHE_HOME:-~/.cache}/verbrpc-softroce)
#   VRPC_SOFTROCE_KPKG   kernel package (default: the one linux-image-amd64 depends on;
#                        a .deb already in the cache wins, which pins the version)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${VRPC_SOFTROCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/verbrpc-softroce}
log() { printf 'softroce: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

for tool in qemu-system-x86_64 busybox depmod modprobe cpio xz dpkg apt-get; do
    command -v "$tool" >/dev/null || die "'$tool' is missing: run scripts/install-deps.sh (as root)"
done
[[ -x /usr/bin/busybox ]] && file_is_static=$(LC_ALL=C ldd /usr/bin/busybox 2>&1 || true)
[[ ${file_is_static:-} == *"not a dynamic"* ]] || die "/usr/bin/busybox is not static: install busybox-static"
mkdir -p "$CACHE"

# ---- the kernel package -------------------------------------------------------
KDEB=$(ls "$CACHE"/linux-image-*.deb 2>/dev/null | sort -V | tail -1 || true)
if [[ -n ${VRPC_SOFTROCE_KPKG:-} ]]; then
    KDEB=$(ls "$CACHE/${VRPC_SOFTROCE_KPKG}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
fi
if [[ -z $KDEB ]]; then
    kpkg=${VRPC_SOFTROCE_KPKG:-}
    find_kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
    [[ -n $kpkg ]] || kpkg=$(find_kpkg)
    if [[ -z $kpkg ]]; then apt-get update -qq >&2 || true; kpkg=$(find_kpkg); fi
    [[ -n $kpkg ]] || die "cannot find the kernel package (apt-cache depends linux-image-amd64 is empty)"
    log "downloading $kpkg into $CACHE"
    (cd "$CACHE" && apt-get download "$kpkg" 2>&1 | grep -v unsandboxed >&2; exit "${PIPESTATUS[0]}") \
        || { apt-get update -qq >&2 && (cd "$CACHE" && apt-get download "$kpkg" >&2); } \
        || die "apt-get download $kpkg failed"
    KDEB=$(ls "$CACHE/${kpkg}"_*.deb | sort -V | tail -1)
fi

# ---- unpacked kernel: modules + depmod, and the ELF vmlinux ---------------------
KROOT=$CACHE/kernel
if [[ ! -e $KROOT/.from-$(basename "$KDEB") ]]; then
    log "unpacking $(basename "$KDEB")"
    rm -rf "$KROOT"; mkdir -p "$KROOT"
    dpkg -x "$KDEB" "$KROOT"
    touch "$KROOT/.from-$(basename "$KDEB")"
fi
KVER=$(ls "$KROOT/lib/modules" | head -1)
[[ -f $KROOT/lib/modules/$KVER/modules.dep ]] || depmod -b "$KROOT" "$KVER"
VMLINUZ=$KROOT/boot/vmlinuz-$KVER
[[ -f $VMLINUZ ]] || die "no $VMLINUZ in $(basename "$KDEB")"
# Under TCG the bzImage's own xz decompressor costs about 4 s per boot: unpack
# the ELF vmlinux once and let qemu enter it through PVH (CONFIG_PVH=y).
KERNEL=$VMLINUZ
VMLINUX=$KROOT/boot/vmlinux-$KVER
if [[ ! -s $VMLINUX ]] && grep -q '^CONFIG_PVH=y' "$KROOT/boot/config-$KVER"; then
    off=$(LC_ALL=C grep -m1 -obUaP '\xfd7zXZ\x00' "$VMLINUZ" | cut -d: -f1 || true)
    # xz stops after the first stream; read from a file, not a pipe (SIGPIPE)
    if [[ -n $off ]] && xz -dc --single-stream < <(tail -c +$((off + 1)) "$VMLINUZ") > "$VMLINUX.tmp" 2>/dev/null \
       && [[ $(head -c4 "$VMLINUX.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]]; then
        mv "$VMLINUX.tmp" "$VMLINUX"
    else
        rm -f "$VMLINUX.tmp"; log "cannot extract vmlinux; booting the bzImage (slower)"
    fi
fi
[[ -s $VMLINUX ]] && KERNEL=$VMLINUX

# ---- initramfs: static busybox, /init, and only the modules we need -------------
INITRD=$CACHE/initramfs-$KVER.cpio     # uncompressed: unpacking is faster under TCG
if [[ ! -f $INITRD || $HERE/guest/init -nt $INITRD || $HERE/prepare.sh -nt $INITRD ]]; then
    log "building the initramfs for $KVER"
    MODS=(virtio_pci 9pnet_virtio 9p rdma_rxe rdma_ucm ib_umad crc32_generic crc32-pclmul veth dummy)
    STAGE=$(mktemp -d)
    trap 'rm -rf "$STAGE"' EXIT
    mkdir -p "$STAGE"/{bin,sbin,dev,proc,sys,host,tmp,lib/modules/$KVER}
    cp /usr/bin/busybox "$STAGE/bin/busybox"
    ln -s busybox "$STAGE/bin/sh"
    ln -s ../bin/busybox "$STAGE/sbin/modprobe"
    mknod -m 600 "$STAGE/dev/console" c 5 1
    mknod -m 666 "$STAGE/dev/null" c 1 3
    : > "$STAGE/modules.list"
    for m in "${MODS[@]}"; do
        modprobe -d "$KROOT" -S "$KVER" --ignore-install --show-depends "$m" | awk '$1 == "insmod" {print $2}'
    done | awk '!seen[$0]++' | while read -r ko; do
        rel=${ko#"$KROOT/lib/modules/$KVER/"}
        mkdir -p "$STAGE/lib/modules/$KVER/$(dirname "$rel")"
        cp "$ko" "$STAGE/lib/modules/$KVER/$rel"
        echo "$rel" >> "$STAGE/modules.list"
    done
    install -m 755 "$HERE/guest/init" "$STAGE/init"
    (cd "$STAGE" && find . -print0 | cpio --null -o -H newc --quiet) > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    log "initramfs ready ($(wc -l < "$STAGE/modules.list") modules)"
fi
echo "KVER=$KVER"
echo "KERNEL=$KERNEL"
echo "INITRD=$INITRD"
