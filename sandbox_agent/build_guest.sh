#!/bin/sh
# Build the Firecracker guest of the reference agent from Debian packages, WITHOUT any registry
# but the machine's apt mirror.
#
# Output in OUTDIR (default var/guest):
#   vmlinux      the ELF kernel Firecracker loads (PVH entry note), unpacked from the LZ4 payload
#                of the Debian cloud kernel's bzImage (Firecracker on x86_64 boots ELF only)
#   initrd.img   gzip'd cpio (newc): /init (sandbox_agent/guest_init.sh), busybox and its applets,
#                sandbox_agent/guest_mmds.sh, sandbox_agent/kici_agent.sh, and the virtio modules with their
#                dependencies (the cloud kernel has virtio_mmio, virtio_blk and virtio_net as
#                modules, and binds virtio-mmio devices only through ACPI: LNRO0005)
#   rootfs.ext4  the same tree as an ext4 image (mkfs.ext4 -d): the rootfs drive the backend
#                requires; the initramfs is what runs
#   BUILD        the hash of the inputs these were built from
# Idempotent: the inputs (kernel package version, busybox, these scripts, the agent tree) are
# hashed and nothing is rebuilt when OUTDIR/BUILD holds that hash. Needs apt-get, dpkg-deb, lz4,
# mkfs.ext4 and busybox-static on the build host. Exits non-zero with a message when a step fails.
#
# The real KiCI agent (label sets with kiciAgent): KICI_GUEST_AGENT_TREE=DIR copies the tree DIR
# over the guest's root, in both artifacts. It must hold an executable usr/local/bin/kici-agent
# (what sandbox_agent/guest_mmds.sh execs when MMDS names a ws:// orchestrator) and everything it runs
# (Node, its shared libraries, the agent's deploy; docs/firecracker-adapter.md). Without it the
# guest holds only busybox and the console's agent: a fast build.
#
# Usage: sandbox_agent/build_guest.sh [OUTDIR]    (KICI_GUEST_KERNEL_PACKAGE overrides the kernel package)
set -eu
umask 022

HERE=$(cd "$(dirname "$0")" && pwd)
OUT="${1:-$HERE/../var/guest}"
META="${KICI_GUEST_KERNEL_PACKAGE:-linux-image-cloud-amd64}"
MODULES="virtio_mmio virtio_blk virtio_net"
TREE="${KICI_GUEST_AGENT_TREE:-}"

die() { echo "build_guest: $*" >&2; exit 1; }
for tool in apt-get apt-cache dpkg-deb lz4 mkfs.ext4 sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || die "$tool is not installed"
done
BUSYBOX=/bin/busybox
file -L "$BUSYBOX" 2>/dev/null | grep -q 'statically linked' || die "$BUSYBOX is not static (apt-get install busybox-static)"

# The metapackage names the versioned image package; its candidate version pins the build.
PKG=$(apt-cache depends "$META" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n1)
[ -n "$PKG" ] || PKG="$META"
VERSION=$(apt-cache policy "$PKG" 2>/dev/null | sed -n 's/^ *Candidate: //p')
[ -n "$VERSION" ] && [ "$VERSION" != "(none)" ] || die "apt offers no $PKG (apt-get update?)"

TREE_HASH=none
if [ -n "$TREE" ]; then
    [ -d "$TREE" ] || die "KICI_GUEST_AGENT_TREE=$TREE is not a directory"
    [ -x "$TREE/usr/local/bin/kici-agent" ] || die "KICI_GUEST_AGENT_TREE=$TREE holds no executable usr/local/bin/kici-agent"
    TREE_HASH=$(tar -C "$TREE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . | sha256sum | cut -c1-64)
fi
BUILD=$(printf '%s=%s\ntree=%s\n' "$PKG" "$VERSION" "$TREE_HASH" | cat - "$BUSYBOX" "$HERE/build_guest.sh" \
    "$HERE/guest_init.sh" "$HERE/guest_mmds.sh" "$HERE/kici_agent.sh" | sha256sum | cut -c1-16)
if [ "$(cat "$OUT/BUILD" 2>/dev/null)" = "$BUILD" ] && [ -s "$OUT/vmlinux" ] && [ -s "$OUT/initrd.img" ] \
    && [ -s "$OUT/rootfs.ext4" ]; then
    echo "build_guest: $OUT is up to date ($BUILD: $PKG $VERSION)"
    exit 0
fi

WORK=$(mktemp -d /tmp/kici-guest.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
mkdir -p "$WORK/deb" "$WORK/pkg" "$WORK/root"
# apt-get download writes into the current directory; _apt must be able to write there.
chmod 0777 "$WORK/deb"
(cd "$WORK/deb" && apt-get download "$PKG=$VERSION" >/dev/null 2>"$WORK/apt.err") \
    || die "apt-get download $PKG=$VERSION failed: $(cat "$WORK/apt.err")"
dpkg-deb -x "$WORK"/deb/*.deb "$WORK/pkg"
KVER=$(ls "$WORK/pkg/lib/modules" | head -n1)
[ -n "$KVER" ] || die "$PKG holds no /lib/modules/<version>"
MODDIR="$WORK/pkg/lib/modules/$KVER"

# vmlinux: the bzImage's payload starts at the legacy LZ4 frame magic 02 21 4c 18. lz4 stops at
# the bzImage's trailer (exit 1: trailing bytes), so the result is checked to be an ELF instead.
VMLINUZ="$WORK/pkg/boot/vmlinuz-$KVER"
OFFSET=$(LC_ALL=C grep -obUaP '\x02\x21\x4c\x18' "$VMLINUZ" | head -n1 | cut -d: -f1)
[ -n "$OFFSET" ] || die "$VMLINUZ holds no LZ4 payload (is the kernel compressed otherwise?)"
tail -c +"$((OFFSET + 1))" "$VMLINUZ" | lz4 -dc > "$WORK/vmlinux" 2>/dev/null || true
[ "$(head -c 4 "$WORK/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ] \
    || die "the LZ4 payload of $VMLINUZ is not an ELF kernel"

# The tree: busybox and its applets, the scripts, the modules and what they depend on (their
# .modinfo "depends=" field: the package carries no modules.dep). The load order is dependencies
# first, written to /lib/modules/load-order for the init.
R="$WORK/root"
mkdir -p "$R/bin" "$R/sbin" "$R/etc" "$R/proc" "$R/sys" "$R/dev" "$R/tmp" "$R/root" "$R/run" "$R/lib/modules"
chmod 1777 "$R/tmp"
cp "$BUSYBOX" "$R/bin/busybox"
for applet in $("$R/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$R/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$R/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$R/etc/group"
install -m 0755 "$HERE/guest_init.sh" "$R/init"
install -m 0755 "$HERE/guest_mmds.sh" "$R/kici_mmds.sh"
install -m 0755 "$HERE/kici_agent.sh" "$R/kici_agent.sh"
if [ -n "$TREE" ]; then
    cp -a "$TREE/." "$R/" || die "copying KICI_GUEST_AGENT_TREE=$TREE failed"
fi

module_file() { find "$MODDIR/kernel" -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" | head -n1; }
ORDER="$WORK/order"
: > "$ORDER"
add_module() {  # add_module NAME: its dependencies first, each module once
    grep -qx "$1" "$ORDER" && return 0
    f=$(module_file "$1")
    [ -n "$f" ] || die "module $1 is not in $PKG"
    case "$f" in
        *.xz) xz -dc "$f" > "$WORK/$1.ko" ;;
        *.zst) zstd -qdc "$f" > "$WORK/$1.ko" ;;
        *) cp "$f" "$WORK/$1.ko" ;;
    esac
    for dep in $(tr '\0' '\n' < "$WORK/$1.ko" | sed -n 's/^depends=//p' | tr ',' ' '); do
        add_module "$dep"
    done
    mv "$WORK/$1.ko" "$R/lib/modules/$1.ko"
    echo "$1" >> "$ORDER"
}
for m in $MODULES; do add_module "$m"; done
cp "$ORDER" "$R/lib/modules/load-order"
echo "$KVER" > "$R/lib/modules/kernel-version"

mkdir -p "$OUT"
(cd "$R" && find . | LC_ALL=C sort | "$R/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null) | gzip -9n > "$WORK/initrd.img"
SIZE_MIB=$(( $(du -sm "$R" | cut -f1) + 8 ))
truncate -s "${SIZE_MIB}M" "$WORK/rootfs.ext4"
PATH="$PATH:/usr/sbin:/sbin" mkfs.ext4 -qF -L kici-guest -d "$R" -E root_owner=0:0 "$WORK/rootfs.ext4" "${SIZE_MIB}M" \
    || die "mkfs.ext4 -d failed"
rm -f "$OUT/BUILD"
for f in vmlinux initrd.img rootfs.ext4; do
    chmod 0644 "$WORK/$f"
    mv -f "$WORK/$f" "$OUT/$f"
done
echo "$BUILD" > "$OUT/BUILD"
echo "build_guest: built $OUT ($BUILD: $PKG $VERSION, modules $(tr '\n' ' ' < "$ORDER")${TREE:+, agent tree $TREE})"
