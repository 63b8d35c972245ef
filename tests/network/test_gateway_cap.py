"""The agent gateway's per-source connection cap (``NftClient.ensure_gateway_cap``) written by the
real kernel and proven with real connections between two namespaces the test made."""

from __future__ import annotations

import logging
import secrets
import socket

import pytest

from network.nft.apply import NftClient
from network.nft.render import render_gateway_cap
from tests.support.network_lab import Netns, run
from tests.support.root import require_root

pytestmark = pytest.mark.root

GATEWAY, CLIENT, PORT, LIMIT = "10.231.0.1", "10.231.0.2", 8000, 3


@pytest.fixture
def lab():
    """A gateway namespace and a client namespace joined by a veth pair (no uplink)."""
    require_root()
    tag = secrets.token_hex(3)
    gw, cl = Netns(f"cap-{tag}-gw"), Netns(f"cap-{tag}-cl")
    try:
        run(["ip", "link", "add", f"capg{tag}", "netns", gw.name, "type", "veth", "peer", "name", f"capc{tag}"])
        run(["ip", "link", "set", f"capc{tag}", "netns", cl.name])
        gw.ip("addr", "add", f"{GATEWAY}/24", "dev", f"capg{tag}")
        cl.ip("addr", "add", f"{CLIENT}/24", "dev", f"capc{tag}")
        gw.ip("link", "set", f"capg{tag}", "up")
        cl.ip("link", "set", f"capc{tag}", "up")
        yield gw, cl, f"kicicap{tag}"
    finally:
        gw.delete()
        cl.delete()


def _connect(ns: Netns) -> socket.socket:
    sock = ns.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(3)
    sock.connect((GATEWAY, PORT))
    return sock


def test_the_cap_is_written_and_a_source_past_it_is_reset(lab, settings, caplog):
    gw, cl, table = lab
    settings.KICI_CONSOLE_URL = f"http://{GATEWAY}:{PORT}"
    settings.KICI_GATEWAY_CONNECTIONS_PER_SOURCE = LIMIT
    client = NftClient(table, netns=gw.name)
    with caplog.at_level(logging.WARNING, logger="network.nft.apply"):
        client.ensure_gateway_cap()
        client.ensure_gateway_cap()  # again, as every base write does: the chain refilled
    assert "connection cap was not written" not in caplog.text, caplog.text
    listed = gw.exec("nft", "list", "table", "inet", table).stdout
    assert f"ct count over {LIMIT}" in listed and listed.count("ct count") == 1, listed

    server = gw.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((GATEWAY, PORT))
    server.listen(16)
    held = [_connect(cl) for _ in range(LIMIT)]
    try:
        with pytest.raises((ConnectionRefusedError, ConnectionResetError)):
            _connect(cl)  # one more from the same source: reset before the listener sees it
    finally:
        for sock in held:
            sock.close()
        server.close()


def test_a_sources_set_made_without_its_rule_is_made_again_with_it(lab, settings, caplog):
    """A table written before the set was made with its rule holds a set that is not dynamic and
    refuses the rule: the cap makes it again instead of staying unwritten."""
    gw, _, table = lab
    settings.KICI_CONSOLE_URL = f"http://{GATEWAY}:{PORT}"
    settings.KICI_GATEWAY_CONNECTIONS_PER_SOURCE = LIMIT
    client = NftClient(table, netns=gw.name)
    client.apply_document(render_gateway_cap(table, GATEWAY, PORT, LIMIT)[:2])  # the set alone
    with caplog.at_level(logging.WARNING, logger="network.nft.apply"):
        client.ensure_gateway_cap()
    assert "connection cap was not written" not in caplog.text, caplog.text
    listed = gw.exec("nft", "list", "table", "inet", table).stdout
    assert f"ct count over {LIMIT}" in listed and "flags dynamic" in listed, listed
