"""A small ctypes binding of libnftables (Debian package ``libnftables1``), the library the ``nft``
binary is built on: commands run in this process, without spawning nft or ``ip netns exec``.

One :class:`NftContext` wraps one ``struct nft_ctx`` with JSON output and buffered output and
error text. A context is not thread-safe, so each call holds the context's lock. With ``netns``,
the context is created and every command runs on a short-lived thread that joined
``/run/netns/<netns>`` (``network.netlink.run_in_netns``), so its netlink socket, and any socket
libnftables reopens, belongs to that namespace.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref

from network.netlink import run_in_netns

#: ``NFT_CTX_DEFAULT`` for ``nft_ctx_new``; ``NFT_CTX_OUTPUT_JSON`` (``1 << 4``) makes listings
#: JSON and lets ``nft_run_cmd_from_buffer`` read a JSON document (it falls back to the nft
#: syntax for a text command such as ``list tables``).
NFT_CTX_DEFAULT = 0
NFT_CTX_OUTPUT_JSON = 1 << 4

DEFAULT_LIBRARY = "libnftables.so.1"


class LibraryUnavailableError(OSError):
    """libnftables could not be loaded (missing package, wrong path) or lacks a needed symbol."""


@functools.cache
def load_library(path: str = DEFAULT_LIBRARY) -> ctypes.CDLL:
    """The loaded library with argument and result types set. Raises LibraryUnavailableError."""
    try:
        lib = ctypes.CDLL(path)
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_free.restype = None
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_ctx_output_set_flags.restype = None
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_int
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    except (OSError, AttributeError) as exc:
        raise LibraryUnavailableError(f"{path} cannot be loaded: {exc}") from None
    return lib


class NftContext:
    """One libnftables context, JSON output, in ``netns`` (None: the caller's namespace).

    ``library``: the shared object to load. Raises LibraryUnavailableError when it cannot be
    loaded, or (on first use) when the context cannot be created.
    """

    def __init__(self, library: str = DEFAULT_LIBRARY, netns: str | None = None):
        self.library = library
        self.netns = netns
        self._lib = load_library(library)
        self._ctx: int | None = None
        self._lock = threading.Lock()

    def run(self, command: str) -> tuple[int, str, str]:
        """Run one command buffer (nft syntax or a JSON document; a JSON document is ONE
        transaction). Returns ``(rc, output, error)``: rc 0 on success, the output and error
        text libnftables buffered. Raises LibraryUnavailableError if no context can be made, and
        NetlinkError (``network.netlink``) if the namespace cannot be joined."""
        data = command.encode()
        with self._lock:
            if self.netns is None:
                return self._run(data)
            return run_in_netns(self.netns, lambda: self._run(data))

    def _run(self, data: bytes) -> tuple[int, str, str]:
        lib = self._lib
        if self._ctx is None:
            ctx = lib.nft_ctx_new(NFT_CTX_DEFAULT)
            if not ctx:
                raise LibraryUnavailableError(f"{self.library}: nft_ctx_new failed")
            lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON)
            if lib.nft_ctx_buffer_output(ctx) or lib.nft_ctx_buffer_error(ctx):
                lib.nft_ctx_free(ctx)
                raise LibraryUnavailableError(f"{self.library}: cannot buffer output")
            self._ctx = ctx
            weakref.finalize(self, lib.nft_ctx_free, ctx)
        rc = lib.nft_run_cmd_from_buffer(self._ctx, data)
        out = lib.nft_ctx_get_output_buffer(self._ctx) or b""
        err = lib.nft_ctx_get_error_buffer(self._ctx) or b""
        return rc, out.decode(errors="replace"), err.decode(errors="replace")
