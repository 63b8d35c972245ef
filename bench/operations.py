"""What an operation with thousands of targets costs: planning bookkeeping, the run's re-check, the
progress writes, and rendering the page.

    .venv/bin/python bench/operations.py [--targets 5000] [--database-url postgres://127.0.0.1:5432/kici_bench_ops]

Creates the scratch database (dropped at the end unless --keep), migrates it, then prints:

* plan digest and the run's re-check (pure) over N targets, ms;
* storing the planned operation (one row, N targets in JSON), ms;
* a run reporting N outcomes through ``operations.jobs.Progress`` (batched writes, one live push
  per write; no channel layer listener): total seconds, writes, megabytes of JSON written;
* rendering the operation page (its first page of rows) and one live row push, ms.

Touches only the scratch database; no docker, nft or network.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=int, default=5000)
    parser.add_argument("--database-url", default="postgres://127.0.0.1:5432/kici_bench_ops")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    with scratch_database(args.database_url, keep=args.keep):
        return run(args.targets)


def run(n: int) -> int:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from django.contrib.auth.models import User
    from django.template.loader import render_to_string

    import live.publish
    from live.consumers import render_update
    from operations.choices import RequestedVia, TargetOutcome
    from operations.jobs import Progress
    from operations.kinds.base import Plan, Scope, Target, plan_digest, recheck
    from operations.models import Operation
    from operations.presenters import detail_context
    from operations.services import store_plan

    live.publish.publish_progress = lambda *a, **k: None  # measure the writes, not a channel layer nobody listens on

    targets = [
        Target(
            f"container:{i:064x}",
            "stop and remove container",
            f"kici-agent-{i:08x}",
            {
                "agent_id": f"scaler-container-{i:08x}",
                "container_state": "exited",
                "status": "Exited (0) 3 minutes ago",
                "registered": False,
                "agent_row": "failed",
                "owner_instance": "console-a",
                "addresses": [f"172.30.{i // 250}.{i % 250 + 2}"],
                "labels": {"kici-managed": "true", "kici-scaler-name": "ci"},
                "age_seconds": 180 + i,
                "why": "exited, not tracked",
            },
        )  # fmt: skip
        for i in range(n)
    ]
    plan = Plan(targets=targets)
    stored = [t.as_json() for t in targets]

    t0 = time.perf_counter()
    plan_digest(stored, {"status", "age_seconds"})
    t1 = time.perf_counter()
    checked = recheck(stored, plan, {"status", "age_seconds"})
    t2 = time.perf_counter()
    assert len(checked.matched) == n
    print(f"targets: {n}")
    print(f"plan digest: {1000 * (t1 - t0):.1f} ms; run re-check: {1000 * (t2 - t1):.1f} ms")

    user = User.objects.create_user("bench")
    t0 = time.perf_counter()
    op = store_plan("orphan-containers", Scope(), plan, None, via=RequestedVia.SWEEP)
    print(f"store planned operation: {1000 * (time.perf_counter() - t0):.1f} ms")

    writes = {"count": 0, "bytes": 0}
    real_flush = Progress.flush

    def counting_flush(self):
        if self._dirty_keys or self._log_from is not None:
            import json

            writes["count"] += 1
            new_log = self.entries[self._log_from :] if self._log_from is not None else []
            writes["bytes"] += len(json.dumps({k: self.outcomes[k] for k in self._dirty_keys})) + len(
                json.dumps(new_log)
            )
        real_flush(self)

    Progress.flush = counting_flush
    progress = Progress(op)
    t0 = time.perf_counter()
    for t in targets:
        progress.report(t.key, TargetOutcome.DONE, "removed")
        time.sleep(0.0005)  # a docker remove takes far longer; this only spreads reports over time
    progress.flush()
    elapsed = time.perf_counter() - t0
    print(
        f"run progress: {elapsed:.2f} s for {n} outcomes (incl. {n * 0.5:.0f} ms of simulated work); "
        f"{writes['count']} writes, {writes['bytes'] / 1e6:.1f} MB of JSON sent"
    )

    op = Operation.objects.get(pk=op.pk)
    render_to_string(
        "operations/detail.html", {**detail_context(op, user, page=1), "request": None, "user": user}
    )  # compile
    render_update(op.pk, user, keys=[targets[0].key])
    t0 = time.perf_counter()
    html = render_to_string(
        "operations/detail.html", {**detail_context(op, user, page=1), "request": None, "user": user}
    )
    t1 = time.perf_counter()
    messages = render_update(op.pk, user, keys=[targets[-1].key])
    t2 = time.perf_counter()
    print(
        f"page render: {1000 * (t1 - t0):.0f} ms ({len(html) / 1e6:.1f} MB); one live row push: "
        f"{1000 * (t2 - t1):.1f} ms ({sum(map(len, messages))} bytes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
