"""``manage.py operations``: the command-line twin of every operations page action (``plan``,
``show``, ``approve``, ``reject``, ``list``), through ``operations.services`` with the same checks
as the pages. ``--run-now`` runs an approved operation in this process, for a host whose worker is
down; refusals exit 1 with one line saying why. Usage: docs/operations.md ("The command line").
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import BaseCommand, CommandError

from operations.choices import OperationKind, OperationStatus, RequestedVia
from operations.jobs import run_operation
from operations.kinds.base import PlanRefused, ScopeInvalid
from operations.models import Operation
from operations.presenters import evidence_items
from operations.services import NothingToDo, OperationError, approve_operation, create_operation, reject_operation


class Command(BaseCommand):
    help = "Plan, show, approve, reject and list operations (the CLI twin of /operations/)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)

        plan = sub.add_parser("plan", help="plan an operation and print its preview")
        plan.add_argument("kind", choices=[k.value for k in OperationKind])
        plan.add_argument("--scaler")
        plan.add_argument("--agent", action="append", default=[], help="agent id (repeatable)")
        plan.add_argument("--label-set", type=int)
        plan.add_argument("--host", help="pause / resume: the host (KICI_HOST_NAME) instead of one scaler")
        plan.add_argument("--reason", help="pause, agent-hold: why (shown to operators; a pause's in /scale's 409)")
        plan.add_argument("--drain", action="store_true", help="pause: drain the running agents too")
        plan.add_argument("--seconds", type=int, help="agent-hold: how long the sandbox is kept once it ends")
        group = plan.add_mutually_exclusive_group()
        group.add_argument(
            "--host-access",
            nargs="*",
            metavar="ENTRY",
            help="the new hostAccess list (no entries = explicit empty list)",
        )
        group.add_argument("--host-access-default", action="store_true", help="back to the default host access")
        group.add_argument(
            "--host-access-revert", action="store_true", help="back to the host access scalers.yaml says, following it"
        )
        plan.add_argument("--user", required=True, help="the requesting user (needs operations.request_operation)")

        show = sub.add_parser("show", help="print one operation: plan, outcomes, log, audit")
        show.add_argument("id", type=int)

        for verb in ("approve", "reject"):
            p = sub.add_parser(verb, help=f"{verb} a planned operation")
            p.add_argument("id", type=int)
            p.add_argument("--user", required=True, help="the deciding user (needs operations.approve_operation)")
            p.add_argument("--note", default="")
            if verb == "approve":
                p.add_argument(
                    "--run-now",
                    action="store_true",
                    help="run here and now instead of enqueueing (this host's queue only)",
                )
                p.add_argument(
                    "--confirm-warnings",
                    action="store_true",
                    help="approve an operation with warnings (`show ID` prints them): you have read them",
                )

        lst = sub.add_parser("list", help="list operations, newest first")
        lst.add_argument("--status", choices=[s.value for s in OperationStatus])
        lst.add_argument("--kind", choices=[k.value for k in OperationKind])
        lst.add_argument("--scaler")
        lst.add_argument("--limit", type=int, default=50)

    def handle(self, *args, **options):
        return getattr(self, f"do_{options['action']}")(options)

    # -- helpers -------------------------------------------------------------------------------

    def _user(self, username: str):
        User = get_user_model()
        try:
            return User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"--user: no user named {username!r}") from None

    def _operation(self, pk: int) -> Operation:
        try:
            return Operation.objects.select_related("requested_by", "approved_by", "rejected_by").get(pk=pk)
        except Operation.DoesNotExist:
            raise CommandError(f"no operation #{pk}") from None

    def _print(self, op: Operation) -> None:
        w = self.stdout.write
        shown = op.shown_status()
        w(f"operation #{op.pk}: {op.get_kind_display()} [{shown.name}{': ' + shown.detail if shown.detail else ''}]")
        w(f"  scope: {op.scope_label}; queue {op.host_queue}")
        w(
            f"  requested by {op.requested_by.get_username() if op.requested_by else 'system'} via "
            f"{op.requested_via} at {op.created_at:%Y-%m-%d %H:%M:%S}; expires {op.expires_at:%Y-%m-%d %H:%M:%S}"
        )
        if op.decided_at:
            who = "policy" if op.auto_approved else (op.approved_by or op.rejected_by)
            w(
                f"  decided by {who} at {op.decided_at:%Y-%m-%d %H:%M:%S}"
                + (f": {op.decision_note}" if op.decision_note else "")
            )
        for warning in op.warnings:
            w(f"  WARNING: {warning}")
        if op.error:
            w(f"  error: {op.error}")
        for note in op.notes:
            w(f"  note: {note}")
        w(f"  targets ({len(op.plan)}):")
        for t in op.plan:
            outcome = (op.outcomes or {}).get(t["key"])
            result = f" => {outcome['outcome']}: {outcome['detail']}" if outcome else ""
            w(f"    - {t['subject']}: {t['action']}{result}")
            w("      " + "; ".join(f"{k}: {v}" for k, v in evidence_items(t.get("evidence", {}))))
        if op.spared:
            w(f"  spared ({len(op.spared)}):")
            for s in op.spared:
                w(f"    - {s['subject']}: {s['reason']}")

    # -- actions -------------------------------------------------------------------------------

    def do_plan(self, options):
        user = self._user(options["user"])
        params: dict = {}
        if options["host_access_revert"]:
            params["revert_to_file"] = True
        elif options["host_access_default"]:
            params["host_access"] = None
        elif options["host_access"] is not None:
            params["host_access"] = list(options["host_access"])
        if options["host"] is not None:
            params["host"] = options["host"]
        if options["reason"] is not None:
            params["reason"] = options["reason"]
        if options["drain"]:
            params["drain"] = True
        if options["seconds"] is not None:
            params["seconds"] = options["seconds"]
        scope = {
            "scaler": options["scaler"],
            "agent_ids": options["agent"],
            "label_set": options["label_set"],
            "params": params,
        }
        try:
            op = create_operation(options["kind"], scope, user, via=RequestedVia.CLI)
        except PermissionDenied as exc:
            raise CommandError(f"permission denied: {exc}") from None
        except NothingToDo as exc:
            self.stdout.write(f"{exc}; no operation was created")
            for s in exc.plan.spared:
                self.stdout.write(f"  spared {s.subject}: {s.reason}")
            for note in exc.plan.notes:
                self.stdout.write(f"  note: {note}")
            return
        except (ScopeInvalid, PlanRefused, OperationError) as exc:
            raise CommandError(str(exc)) from None
        if op.reused:
            self.stdout.write(f"an identical plan is already open: operation #{op.pk}")
        self._print(op)

    def do_show(self, options):
        op = self._operation(options["id"])
        self._print(op)
        if op.log:
            self.stdout.write("  log:")
            for entry in op.log:
                self.stdout.write(f"    {entry['at'][:19]} {entry['level']}: {entry['message']}")
        self.stdout.write("  audit:")
        for a in op.audit.all():
            self.stdout.write(
                f"    {a.at:%Y-%m-%d %H:%M:%S} {a.username or 'system'} {a.action} {a.from_status or '-'} -> "
                f"{a.to_status}" + (f": {a.detail}" if a.detail else "")
            )

    def do_approve(self, options):
        user = self._user(options["user"])
        op = self._operation(options["id"])
        run_now = options.get("run_now")
        if run_now and op.host_queue != settings.KICI_HOST_QUEUE:
            raise CommandError(
                f"--run-now runs on this host ({settings.KICI_HOST_QUEUE}); operation #{op.pk} belongs to "
                f"{op.host_queue}"
            )
        try:
            approve_operation(
                op,
                user,
                note=options["note"],
                require_worker=not run_now,
                enqueue=not run_now,
                warnings_confirmed=bool(options.get("confirm_warnings")),
            )
        except PermissionDenied as exc:
            raise CommandError(f"permission denied: {exc}") from None
        except OperationError as exc:
            raise CommandError(str(exc)) from None
        if run_now:
            self.stdout.write(run_operation(op.pk))
        else:
            self.stdout.write(f"operation #{op.pk} approved; enqueued on {op.host_queue} as job {op.rq_job_id}")

    def do_reject(self, options):
        user = self._user(options["user"])
        op = self._operation(options["id"])
        try:
            reject_operation(op, user, note=options["note"])
        except PermissionDenied as exc:
            raise CommandError(f"permission denied: {exc}") from None
        except OperationError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"operation #{op.pk} rejected; it will never run")

    def do_list(self, options):
        qs = Operation.objects.select_related("requested_by")
        if options["status"]:
            qs = qs.filter(status=options["status"])
        if options["kind"]:
            qs = qs.filter(kind=options["kind"])
        if options["scaler"]:
            qs = qs.filter(scaler_name=options["scaler"])
        rows = list(qs[: max(1, options["limit"])])
        if not rows:
            self.stdout.write("no operations")
            return
        for op in rows:
            shown = op.shown_status()
            self.stdout.write(
                f"#{op.pk:<6} {shown.name:<12} {op.kind:<22} {len(op.plan):>5} target(s)"
                f"{', ' + shown.detail if shown.detail else ''}  {op.scope_label}  "
                f"{op.created_at:%Y-%m-%d %H:%M} by {op.requested_by.get_username() if op.requested_by else 'system'}"
            )
