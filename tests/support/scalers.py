"""Shared builders for the container / bare-metal / event backend tests (helper ctr)."""

from __future__ import annotations

import secrets
import socket
import threading
from contextlib import contextmanager

from agents.choices import AgentState
from agents.models import Agent
from scalers.models import LabelSet, Reservation, Scaler

#: Docker label value prefix for every scaler name these tests create (cleanup by prefix).
PREFIX = "ctr-t-"


def make_scaler(
    name: str | None = None, type: str = "container", labels=("linux", "ctr"), ls_config: dict | None = None, **fields
) -> Scaler:
    """A scaler with one label set; ``ls_config`` is the label-set entry (yaml names)."""
    name = name or f"{PREFIX}{secrets.token_hex(3)}"
    config = fields.pop("config", {})
    scaler = Scaler.objects.create(
        name=name, type=type, max_agents=fields.pop("max_agents", 10), config=config, **fields
    )
    entry = {"labels": list(labels), "image": "kici-agent:local", "imagePullPolicy": "Never"}
    if ls_config is not None:
        entry = {"labels": list(labels), **ls_config}
    LabelSet.objects.create(
        scaler=scaler,
        index=0,
        labels=list(labels),
        normalized=",".join(sorted(set(labels))),
        config=entry,
        host_access=(entry.get("networkPolicy") or {}).get("hostAccess"),
    )
    return scaler


def make_agent(scaler: Scaler, state: str = AgentState.SPAWNING, reserve: bool = True, **fields) -> Agent:
    """An admitted agent row (and its reservation), as admission would write it."""
    agent_id = fields.pop("agent_id", f"scaler-{scaler.type}-{secrets.token_hex(4)}")
    ls = scaler.label_sets.first()
    agent = Agent.objects.create(
        agent_id=agent_id,
        scaler=scaler,
        label_set=ls,
        state=state,
        labels=fields.pop("labels", list(ls.labels) + [f"kici:agent:{scaler.type}", f"kici:scaler:{scaler.name}"]),
        owner_instance="test",
        **fields,
    )
    if reserve:
        Reservation.objects.create(scaler=scaler, agent=agent, cpus=1, memory_bytes=1 << 30, owner_instance="test")
    return agent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def wsgi_server(host: str, port: int):
    """Serve the Django WSGI app threaded on ``host:port`` (the test's own bridge or loopback)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server(host, port, get_wsgi_application(), server_class=Server, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()


def remove_test_containers(client) -> int:
    """Force-remove every kici-managed container of a scaler named ``ctr-t-…`` (a failed test's leftovers)."""
    removed = 0
    for c in client.api.containers(all=True, filters={"label": "kici-managed=true"}):
        if (c.get("Labels") or {}).get("kici-scaler-name", "").startswith(PREFIX):
            client.api.remove_container(c["Id"], force=True)
            removed += 1
    return removed


def register_at_network_stage(monkeypatch, agent) -> None:
    """Make ``agent`` register (real endpoint, with the token its spawn minted) at the moment its
    spawn asks for the container's address: a fast agent, registered before the network stage ends."""
    import json

    from django.test import Client

    import agents.tokens
    import scalers.backends.container.spawn as spawn_module

    minted: list[str] = []
    real_mint, real_ip = agents.tokens.mint_registration_token, spawn_module.container_network_ip

    def mint(a, *args, **kwargs):
        minted.append(real_mint(a, *args, **kwargs))
        return minted[-1]

    def register_then_address(docker, container_id):
        answer = Client().post(
            "/api/v1/agents/register",
            data=json.dumps({"agentId": agent.agent_id}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {minted[-1]}",
        )
        assert answer.status_code == 200, answer.content
        return real_ip(docker, container_id)

    monkeypatch.setattr(agents.tokens, "mint_registration_token", mint)
    monkeypatch.setattr(spawn_module, "container_network_ip", register_then_address)


def nft_table_for(settings, table: str, *, create: bool = True):
    """Fixture body: make ``table`` the console's nft table (``settings.KICI_NFT_TABLE``), create it
    unless ``create`` is False (the code under test must then create it), yield its ``NftClient``,
    and drop it afterwards. Use as ``yield from nft_table_for(settings, TABLE)``; needs root."""
    from network.nft.apply import NftClient
    from tests.conftest import require_root

    require_root()
    settings.KICI_NFT_TABLE = table
    client = NftClient(table)
    if create:
        client.ensure_table()
    yield client
    client.delete_table()
