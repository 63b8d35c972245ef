"""Raw Ethernet frames for layer-2 isolation tests: ARP replies, IPv4/UDP with any source, behind
any stack of VLAN tags, sent from inside a namespace through an AF_PACKET socket or written to a
TAP as its guest would; a sniffer that says whether a frame reached a port.

Frames go only to bridges, veths and TAPs a test created in namespaces it created (no uplink).
"""

from __future__ import annotations

import fcntl
import io
import os
import socket
import struct
import subprocess
import tarfile
import time
from pathlib import Path

from tests.support.network_lab import in_netns

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
ETH_P_ARP = 0x0806
#: Tag protocol ids: 802.1Q, 802.1ad (QinQ outer) and the old pre-standard QinQ.
TPID_8021Q = 0x8100
TPID_8021AD = 0x88A8
TPID_9100 = 0x9100
#: Tag stacks the tests send (outermost first); VLAN id 0, which Linux strips without a VLAN
#: device, so a frame that crosses the bridge reaches the receiver's sockets.
TAGS = {
    "untagged": (),
    "one 802.1Q tag": (TPID_8021Q,),
    "802.1ad + 802.1Q": (TPID_8021AD, TPID_8021Q),
    "two 802.1Q tags": (TPID_8021Q, TPID_8021Q),
    "0x9100 tag": (TPID_9100,),
}


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def ethernet(dst: str, src: str, ethertype: int, payload: bytes, tags: tuple[int, ...] = ()) -> bytes:
    """One frame: ``dst``/``src`` MACs, then a VLAN-0 tag per TPID in ``tags``, then ``ethertype``."""
    head = mac_bytes(dst) + mac_bytes(src)
    for tpid in tags:
        head += struct.pack("!HH", tpid, 0)
    frame = head + struct.pack("!H", ethertype) + payload
    return frame + b"\x00" * max(0, 60 - len(frame))


def arp_reply(sender_mac: str, sender_ip: str, target_mac: str, target_ip: str) -> bytes:
    """An ARP reply payload: "``sender_ip`` is at ``sender_mac``" addressed to the target."""
    return struct.pack("!HHBBH", 1, ETH_P_IP, 6, 4, 2) + (
        mac_bytes(sender_mac) + socket.inet_aton(sender_ip) + mac_bytes(target_mac) + socket.inet_aton(target_ip)
    )


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_udp(src: str, dst: str, sport: int, dport: int, data: bytes) -> bytes:
    """An IPv4 packet carrying one UDP datagram (UDP checksum 0: none)."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0x4000, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst)
    )
    header = header[:10] + struct.pack("!H", _checksum(header)) + header[12:]
    return header + udp


def packet_socket(netns: str, ifname: str) -> socket.socket:
    """An AF_PACKET socket bound to ``ifname``, created inside ``netns`` (needs CAP_NET_RAW there)."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((ifname, 0))
        return sock

    return in_netns(netns, make)  # type: ignore[return-value]


def send_frames(netns: str, ifname: str, frames: list[bytes], repeat: int = 3) -> None:
    """Send each frame ``repeat`` times from ``ifname`` inside ``netns``."""
    sock = packet_socket(netns, ifname)
    try:
        for _ in range(repeat):
            for frame in frames:
                sock.send(frame)
            time.sleep(0.02)
    finally:
        sock.close()


TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def write_to_tap(netns: str, tap: str, frames: list[bytes], repeat: int = 3) -> None:
    """Write frames to the TAP ``tap`` in ``netns`` as its guest would (each enters the bridge
    through the TAP, exactly like a Firecracker guest's)."""

    def attach() -> int:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
        return fd

    fd: int = in_netns(netns, attach)  # type: ignore[assignment]
    try:
        for _ in range(repeat):
            for frame in frames:
                os.write(fd, frame)
            time.sleep(0.02)
    finally:
        os.close(fd)


class Sniffer:
    """Every frame arriving on ``ifname`` in ``netns`` (an AF_PACKET socket, opened before the
    frames are sent). :meth:`saw` says whether one carrying ``marker`` arrived."""

    def __init__(self, netns: str, ifname: str):
        self.sock = packet_socket(netns, ifname)
        self.sock.settimeout(0.05)

    def saw(self, marker: bytes, wait: float = 0.6) -> bool:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                data, addr = self.sock.recvfrom(65535)
            except TimeoutError:
                continue
            if addr[2] != socket.PACKET_OUTGOING and marker in data:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


RAWFRAME_SOURCE = Path(__file__).with_name("rawframe.c")
#: Where :func:`copy_rawframe` puts the helper inside a container.
RAWFRAME_PATH = "/kici-rawframe"


def build_rawframe(directory: Path) -> Path:
    """Compile ``rawframe.c`` (static, so it runs in the busybox agent image) into ``directory``."""
    out = directory / "rawframe"
    subprocess.run(
        ["gcc", "-static", "-O2", "-Wall", "-o", str(out), str(RAWFRAME_SOURCE)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out


def copy_rawframe(api, container_id: str, binary: Path) -> None:
    """Put the helper at :data:`RAWFRAME_PATH` in a container (docker's archive API)."""
    data = binary.read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(RAWFRAME_PATH.lstrip("/"))
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    assert api.put_archive(container_id, "/", buf.getvalue())


def rawframe_in(api, container_id: str, frames: list[bytes]) -> tuple[int, str]:
    """Run the helper inside the container as its agent would run a job step (same user, same
    capabilities): ``(exit code, output)``; 77 means the packet socket was refused."""
    exec_id = api.exec_create(container_id, [RAWFRAME_PATH, "eth0", *(f.hex() for f in frames)])["Id"]
    output = api.exec_start(exec_id).decode(errors="replace")
    return api.exec_inspect(exec_id)["ExitCode"], output
