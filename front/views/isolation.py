"""The agent page's isolation fragments: rules read back from the kernel, and the live self-test."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from lib.htmx import wants_partial
from network.nft import apply
from scalers.selftest import can_run_selftest, isolation_context, run_agent_selftest

from .common import agent_or_404, viewer_required

log = logging.getLogger(__name__)


@require_GET
@viewer_required
def agent_isolation(request, agent_id: str):
    """The agent's isolation rules read back from the kernel: a fragment for the agent page's htmx
    request, the same inside the page frame when the address is opened directly.

    A finished agent (``destroyed`` / ``failed``) is not read back: its rules were removed with it,
    and its former address may belong to another agent by now, whose rules a read-back would show
    as this agent's (``removed`` in the context)."""
    agent = agent_or_404(agent_id)
    table = isolation_context(agent).table
    ctx: dict[str, Any] = {
        "agent": agent,
        "table": table,
        "lines": None,
        "error": "",
        "complete": None,
        "removed": False,
    }
    if not agent.is_active:
        ctx["removed"] = True
    elif not agent.ip:
        ctx["error"] = "the agent has no address yet, so it has no isolation rules"
    else:
        try:
            rules = apply.NftClient(table).list_agents().get(ipaddress.ip_address(agent.ip))
        except Exception as exc:  # noqa: BLE001 - nft missing, no privilege, bad table: say so
            ctx["error"] = f"could not read table inet {table}: {exc}"
        else:
            if rules is None:
                ctx["lines"] = []
            else:
                ctx["lines"] = rules.describe()
                ctx["complete"] = rules.complete
    if not wants_partial(request):
        return render(request, "agents/isolation_page.html", {**ctx, "nav": "agents"})
    return render(request, "agents/detail.html#isolation", ctx)


def selftest_rows(results) -> list[dict]:
    """``network.selftest.ProbeResult`` list → table rows ``{target, why, expected, observed, ok,
    detail, ms, probed}``; ``ok`` is True / False, or None when it cannot tell (a UDP probe, an
    unverifiable target expected reachable). ``observed`` is worded for people: a target judged
    from the rules reads "blocked by rule (verified, not probed)"."""
    rows = []
    for r in results:
        rows.append(
            {
                "target": str(r.target),
                "why": r.target.label,
                "expected": "reachable" if r.target.expect_reachable else "blocked",
                "observed": getattr(r, "observed", r.state),
                "ok": r.passed,
                "detail": r.detail,
                "ms": round(r.elapsed_s * 1000),
                "probed": getattr(r, "probed", True),
            }
        )
    return rows


@require_POST
@viewer_required
def agent_selftest(request, agent_id: str):
    """POST: run the live isolation self-test for this agent and render the reachability table.

    Needs ``operations.request_operation`` or ``agents.change_agent`` (it sends probe packets from
    inside the agent's namespace).
    Refusals render as a message in the fragment, never a 500."""
    agent = agent_or_404(agent_id)
    ctx: dict[str, Any] = {"agent": agent}
    if not can_run_selftest(request.user):
        ctx["error"] = "running the self-test needs the permission operations.request_operation (operators)"
        return render(request, "agents/detail.html#selftest", ctx, status=403)
    if not agent.is_active or not agent.ip:
        ctx["error"] = (
            f"agent {agent.agent_id} is {agent.state} and has "
            f"{'address ' + agent.ip if agent.ip else 'no address'}: nothing to probe"
        )
    else:
        try:
            rows = selftest_rows(run_agent_selftest(agent))
        except Exception as exc:  # noqa: BLE001 - show why, never a 500 in a fragment
            log.info("isolation self-test for %s could not run: %s", agent.agent_id, exc)
            ctx["error"] = f"the self-test could not run: {exc}"
        else:
            ctx.update(
                rows=rows,
                failed=sum(1 for r in rows if r["ok"] is False),
                unknown=sum(1 for r in rows if r["ok"] is None),
            )
            ctx.update(probed=sum(1 for r in rows if r["probed"]), verified=sum(1 for r in rows if not r["probed"]))
            ctx["passed"] = bool(rows) and ctx["failed"] == 0
    return render(request, "agents/detail.html#selftest", ctx)
