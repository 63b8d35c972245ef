"""A real KiCI orchestrator's admin interface, as the console uses it for the label sets whose
sandboxes run the real KiCI agent: mint and revoke each agent's token, list the agents registered
with it, and whether a token was ever presented (design: docs/real-kici-agent.md). The admin token
is decrypted for each call and never logged, shown or put in a message; every call is bounded by
:data:`CALL_TIMEOUT_SECONDS` and a failure raises :class:`OrchestratorError` naming the URL and the
orchestrator's answer.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from scalers.credentials import CredentialError, decrypt_text
from scalers.labels import role_labels
from scalers.models import OrchestratorAdminToken

#: Seconds one admin call may take (connect and answer).
CALL_TIMEOUT_SECONDS = 10
#: ``backend_context`` key of a real agent's orchestrator token id (revoked when the agent ends).
KICI_TOKEN_ID = "kici_token_id"
#: Characters of an orchestrator's answer kept in an error message.
ANSWER_CHARS = 300
#: The prefix of a role label (``kici:role:builder``).
ROLE_PREFIX = "kici:role:"


class OrchestratorError(RuntimeError):
    """An admin call failed: no such admin token, the orchestrator unreachable, or a refusal.
    The message names the URL and the answer, never the token."""


@dataclass(frozen=True)
class KiciAgentTarget:
    """The orchestrator a label set's real agents register with: ``ws_url`` (the agents'
    ``KICI_ORCHESTRATOR_URL``), ``admin_url`` and the name of its admin token."""

    ws_url: str
    admin_url: str
    admin_token_ref: str

    @property
    def port(self) -> int:
        """The TCP port of ``ws_url`` (explicit, else 80 for ws and 443 for wss)."""
        parsed = urlsplit(self.ws_url)
        return parsed.port or (443 if parsed.scheme == "wss" else 80)

    @property
    def host(self) -> str:
        return urlsplit(self.ws_url).hostname or ""


def token_context(target: KiciAgentTarget, token_id: str) -> dict[str, str]:
    """What an agent row keeps of its orchestrator token (``backend_context``): its id and where
    to revoke it, so a reload that changes or drops the label set's ``kiciAgent`` cannot strand it."""
    return {KICI_TOKEN_ID: token_id, "kici_admin_url": target.admin_url, "kici_admin_token_ref": target.admin_token_ref}


def token_to_revoke(context: dict) -> tuple[KiciAgentTarget, str] | None:
    """``(where, token id)`` of the orchestrator token :func:`token_context` recorded, or None."""
    token_id = context.get(KICI_TOKEN_ID)
    if not token_id or not context.get("kici_admin_url") or not context.get("kici_admin_token_ref"):
        return None
    return KiciAgentTarget("", str(context["kici_admin_url"]), str(context["kici_admin_token_ref"])), str(token_id)


def kici_agent_target(label_set) -> KiciAgentTarget | None:
    """The ``kiciAgent`` of ``label_set`` (a ``LabelSet`` row, its stored yaml), or None when its
    sandboxes run the console's own agent. ``adminUrl`` defaults to the WebSocket URL's host and
    port over http(s)."""
    config = ((label_set.config or {}) if label_set is not None else {}).get("kiciAgent")
    if not config:
        return None
    ws_url = str(config["orchestratorUrl"])
    admin_url = config.get("adminUrl")
    if not admin_url:
        parsed = urlsplit(ws_url)
        admin_url = urlunsplit(("https" if parsed.scheme == "wss" else "http", parsed.netloc, "", "", ""))
    return KiciAgentTarget(ws_url, str(admin_url).rstrip("/"), str(config["adminTokenRef"]))


@dataclass(frozen=True)
class ScaleUpClaim:
    """What a KiCI event scaler's scale-up gave its agent (``scalers.api.kici_scale_up``, kept on
    the agent row's ``scale_body``): the orchestrator's ``/ws`` URL, the single-use claim code the
    agent redeems there for its own token (``KICI_SCALER_CLAIM_CODE``), and the labels it
    registers with (the job's and the orchestrator's ``kici:*`` ones)."""

    orchestrator_url: str
    claim_code: str
    labels: tuple[str, ...]

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles its ``kici:role:*`` labels name (the token the claim mints allows only those)."""
        return tuple(label.removeprefix(ROLE_PREFIX) for label in self.labels if label.startswith(ROLE_PREFIX))


def scale_up_claim(agent) -> ScaleUpClaim | None:
    """The :class:`ScaleUpClaim` of ``agent`` when a KiCI scale-up asked for it, else None."""
    body = agent.scale_body
    if not isinstance(body, dict) or not body.get("claimCode"):
        return None
    return ScaleUpClaim(
        str(body["orchestratorUrl"]), str(body["claimCode"]), tuple(str(label) for label in body["labels"])
    )


def agent_labels(label_set) -> list[str]:
    """The labels a real agent of ``label_set`` sends (``KICI_LABELS``): its declared labels."""
    return [str(label) for label in label_set.labels]


def token_labels(label_set, roles) -> list[str]:
    """The labels the agent's token must allow: its own (:func:`agent_labels`) and the
    ``kici:role:*`` label of each role it takes (``roles``: the scaler's, ``None`` = all)."""
    return agent_labels(label_set) + role_labels(roles)


def _admin_token(target: KiciAgentTarget) -> str:
    row = OrchestratorAdminToken.objects.filter(name=target.admin_token_ref).first()
    if row is None:
        raise OrchestratorError(f"no orchestrator admin token named {target.admin_token_ref!r} (add it at /admin/)")
    try:
        return decrypt_text(row.secret, f"orchestrator admin token {row.name!r}")
    except CredentialError as exc:
        raise OrchestratorError(str(exc)) from None


def _call(target: KiciAgentTarget, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    """One admin call; returns ``(status, parsed JSON or text)`` for any HTTP answer. Raises
    :class:`OrchestratorError` when the orchestrator cannot be reached or answers no HTTP."""
    url = target.admin_url + path
    headers = {"authorization": f"Bearer {_admin_token(target)}", "content-type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_SECONDS) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except (OSError, ValueError) as exc:
        raise OrchestratorError(f"{method} {url}: {exc}") from None
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _refused(method: str, url: str, status: int, answer: object) -> OrchestratorError:
    return OrchestratorError(f"{method} {url} answered {status}: {json.dumps(answer)[:ANSWER_CHARS]}")


def mint_agent_token(target: KiciAgentTarget, labels: list[str]) -> tuple[str, str]:
    """A new agent token bound to ``labels``: ``(token id, kat_ token)``. Raises
    :class:`OrchestratorError` when the orchestrator refuses or answers without one."""
    status, answer = _call(target, "POST", "/api/v1/agent-tokens", {"labels": labels})
    if status != 201 or not isinstance(answer, dict) or not str(answer.get("token", "")).startswith("kat_"):
        raise _refused("POST", target.admin_url + "/api/v1/agent-tokens", status, _without_token(answer))
    return str(answer["id"]), str(answer["token"])


def _without_token(answer: object) -> object:
    if isinstance(answer, dict) and "token" in answer:
        return {**answer, "token": "***"}
    return answer


def revoke_agent_token(target: KiciAgentTarget, token_id: str) -> bool:
    """Revoke token ``token_id`` (the orchestrator closes every connection it authenticated).
    True when revoked now, False when the orchestrator knows no live token of that id (already
    revoked). Raises :class:`OrchestratorError` on any other answer."""
    path = f"/api/v1/agent-tokens/{quote(token_id, safe='')}"
    status, answer = _call(target, "DELETE", path)
    if status == 200:
        return True
    if status == 404:
        return False
    raise _refused("DELETE", target.admin_url + path, status, answer)


def connected_agent_ids(target: KiciAgentTarget) -> set[str]:
    """The ids of the agents registered with the orchestrator now (its fleet topology). Raises
    :class:`OrchestratorError` when it cannot say."""
    status, answer = _call(target, "GET", "/admin/fleet-topology")
    if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("nodes"), list):
        raise _refused("GET", target.admin_url + "/admin/fleet-topology", status, answer)
    return {str(node.get("id")) for node in answer["nodes"] if isinstance(node, dict) and node.get("kind") == "agent"}


def token_last_seen(target: KiciAgentTarget, token_id: str) -> str:
    """What the orchestrator says of token ``token_id``: ``never presented``, ``last presented at
    <time>``, ``not listed (revoked)``, or why it could not be asked. Never raises: this is for
    failure messages."""
    try:
        status, answer = _call(target, "GET", "/api/v1/agent-tokens")
    except OrchestratorError as exc:
        return f"could not be asked ({exc})"
    if status != 200 or not isinstance(answer, dict):
        return f"could not be asked (answered {status})"
    for token in answer.get("tokens") or []:
        if isinstance(token, dict) and str(token.get("id")) == token_id:
            seen = token.get("lastSeenAt")
            return f"last presented at {seen}" if seen else "never presented"
    return "not listed (revoked)"
