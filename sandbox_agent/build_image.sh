#!/bin/sh
# Build the reference agent image `kici-agent:local` WITHOUT any registry.
#
# The image is a `docker import` of a rootfs tarball: Debian's busybox-static binary (installed
# with apt-get when missing), one symlink per busybox applet, and sandbox_agent/kici_agent.sh as CMD.
# Idempotent and fast: the inputs are hashed, and when an image with that hash (ENV
# KICI_AGENT_BUILD) already exists nothing is rebuilt.
#
# Usage: sandbox_agent/build_image.sh [IMAGE]    (DOCKER_HOST selects the daemon, as for the docker CLI)
set -eu
# The image's files get their modes from here, not from the caller's umask (077 would leave its
# directories unreadable to a non-root job user).
umask 022

IMAGE="${1:-${KICI_AGENT_IMAGE:-kici-agent:local}}"
HERE=$(cd "$(dirname "$0")" && pwd)

if ! command -v docker >/dev/null 2>&1; then
    echo "build_image: the docker CLI is not installed (apt-get install docker.io)" >&2
    exit 1
fi

BUSYBOX=""
for candidate in /bin/busybox /usr/bin/busybox; do
    if [ -x "$candidate" ] && file -L "$candidate" 2>/dev/null | grep -q 'statically linked'; then
        BUSYBOX="$candidate"; break
    fi
done
if [ -z "$BUSYBOX" ] && dpkg -s busybox-static >/dev/null 2>&1; then
    BUSYBOX=/bin/busybox
fi
if [ -z "$BUSYBOX" ]; then
    echo "build_image: installing busybox-static" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y busybox-static >/dev/null 2>&1 || {
        apt-get update >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y busybox-static >/dev/null
    }
    BUSYBOX=/bin/busybox
fi

BUILD=$(cat "$HERE/kici_agent.sh" "$HERE/build_image.sh" "$BUSYBOX" | sha256sum | cut -c1-16)
existing=$(docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" 2>/dev/null \
    | sed -n 's/^KICI_AGENT_BUILD=//p' || true)
if [ "$existing" = "$BUILD" ]; then
    echo "build_image: $IMAGE is up to date ($BUILD)"
    exit 0
fi

ROOTFS=$(mktemp -d /tmp/kici-agent-rootfs.XXXXXX)
chmod 0755 "$ROOTFS"  # mktemp makes it 0700: it becomes the image's /
trap 'rm -rf "$ROOTFS"' EXIT INT TERM
mkdir -p "$ROOTFS/bin" "$ROOTFS/etc" "$ROOTFS/tmp" "$ROOTFS/proc" "$ROOTFS/sys" "$ROOTFS/dev" "$ROOTFS/root"
chmod 1777 "$ROOTFS/tmp"
cp "$BUSYBOX" "$ROOTFS/bin/busybox"
for applet in $("$ROOTFS/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$ROOTFS/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$ROOTFS/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$ROOTFS/etc/group"
install -m 0755 "$HERE/kici_agent.sh" "$ROOTFS/kici_agent.sh"

tar -C "$ROOTFS" --numeric-owner -cf - . | docker import \
    --change 'ENV PATH=/bin' \
    --change "ENV KICI_AGENT_BUILD=$BUILD" \
    --change 'CMD ["/bin/sh", "/kici_agent.sh"]' \
    - "$IMAGE" >/dev/null
echo "build_image: built $IMAGE ($BUILD)"
