#!/bin/sh
# /init of the KiCI Firecracker guest (busybox sh, PID 1 of the initramfs sandbox_agent/build_guest.sh makes).
#
# Mounts /proc, /sys and /dev; loads the virtio modules listed in /lib/modules/load-order (the
# Debian cloud kernel has them as modules; virtio_mmio binds the devices Firecracker describes in
# its ACPI tables); configures eth0 from the kernel command line's ip=<ip>::<gw>:<mask>::eth0:off
# (the kernel's own IP autoconfiguration is not built in) with a route to MMDS on eth0; then runs
# /kici_mmds.sh (bootstrap data from MMDS, then the agent). When the agent exits the VM is reset
# (reboot=k: Firecracker exits).
#
# `guest_init.sh net` only configures the network (from $KICI_GUEST_CMDLINE, default /proc/cmdline):
# what the tests run in a network namespace.
export PATH=/bin:/sbin
CMDLINE="${KICI_GUEST_CMDLINE:-/proc/cmdline}"
MMDS_ADDRESS="${KICI_MMDS_ADDRESS:-169.254.169.254}"

log() { echo "kici-init: $*"; }

mask_prefix() { # mask_prefix 255.255.255.0 -> 24
    bits=0
    for octet in $(echo "$1" | tr . ' '); do
        while [ "$octet" -gt 0 ]; do
            bits=$((bits + (octet & 1)))
            octet=$((octet >> 1))
        done
    done
    echo "$bits"
}

net_up() { # eth0 from ip=<client>:<server>:<gateway>:<netmask>:<hostname>:<device>:<autoconf>
    spec=""
    for word in $(cat "$CMDLINE"); do
        case "$word" in ip=*) spec="${word#ip=}" ;; esac
    done
    if [ -z "$spec" ]; then
        log "no ip= on the kernel command line"
        return 1
    fi
    old_ifs="$IFS"; IFS=:
    # shellcheck disable=SC2086
    set -- $spec
    IFS="$old_ifs"
    addr="$1" gw="$3" mask="$4" dev="${6:-eth0}"
    if [ -z "$addr" ] || [ -z "$mask" ]; then
        log "ip=$spec names no address and netmask"
        return 1
    fi
    ip link set lo up
    ip link set "$dev" up || return 1
    ip addr add "$addr/$(mask_prefix "$mask")" dev "$dev" || return 1
    ip route add "$MMDS_ADDRESS" dev "$dev" || return 1
    [ -n "$gw" ] && { ip route add default via "$gw" dev "$dev" || return 1; }
    log "$dev is $addr/$(mask_prefix "$mask") via ${gw:-none}"
}

if [ "${1:-}" = net ]; then
    net_up
    exit $?
fi

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/load-order); do
    insmod "/lib/modules/$m.ko" || log "insmod $m failed"
done
n=0
while [ ! -e /sys/class/net/eth0 ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
if net_up; then
    sh /kici_mmds.sh
    log "agent exited ($?)"
else
    log "no network; not starting the agent"
fi
sync
reboot -f
