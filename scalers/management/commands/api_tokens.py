"""``manage.py api_tokens``: the orchestrator's named API tokens (``scalers.api_tokens``), the CLI
twin of ``/tokens/``.

    api_tokens create NAME --scopes scale,read [--expires-days N] --user ADMIN
    api_tokens list
    api_tokens revoke NAME --user ADMIN

``create`` prints the token once; only its hash is kept. ``--user`` must name an active superuser.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from scalers.api_tokens import ENV_TOKEN_NAME, SCOPES, TokenError, create_token, revoke_token, token_state
from scalers.models import ApiToken


class Command(BaseCommand):
    help = "Create, list and revoke the orchestrator's API tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        create = sub.add_parser("create", help="create a token and print it once")
        create.add_argument("name")
        create.add_argument("--scopes", default=",".join(SCOPES), help=f"comma-separated of {', '.join(SCOPES)}")
        create.add_argument("--expires-days", type=int, default=None, help="days until it expires (default never)")
        create.add_argument("--user", required=True, help="the administrator creating it (a superuser)")
        sub.add_parser("list", help="every token, active or not (never the token itself)")
        revoke = sub.add_parser("revoke", help="revoke a token now")
        revoke.add_argument("name")
        revoke.add_argument("--user", required=True, help="the administrator revoking it (a superuser)")

    def handle(self, *args, verb: str, **options):
        getattr(self, f"do_{verb}")(options)

    def _admin(self, username: str) -> str:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"--user: no user named {username!r}")
        if not (user.is_active and user.is_superuser):
            raise CommandError(f"--user: {username} is not an active administrator (superuser)")
        return user.get_username()

    def do_create(self, options):
        who = self._admin(options["user"])
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        try:
            token, raw = create_token(options["name"], scopes, expires_days=options["expires_days"], created_by=who)
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        expires = f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
        self.stdout.write(f"token {token.name} ({', '.join(token.scopes)}{expires}); shown once, keep it now:")
        self.stdout.write(raw)

    def do_list(self, options):
        now = timezone.now()
        self.stdout.write(f"{ENV_TOKEN_NAME} (environment): scale, read")
        for token in ApiToken.objects.all():
            used = f"last used {token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "never used"
            expires = f"expires {token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "no expiry"
            self.stdout.write(
                f"{token.name} [{token_state(token, now)}] {token.prefix}… {', '.join(token.scopes)}; "
                f"{expires}; {used}; created by {token.created_by or '?'}"
            )

    def do_revoke(self, options):
        who = self._admin(options["user"])
        try:
            token = revoke_token(options["name"], revoked_by=who)
        except TokenError as exc:
            raise CommandError(str(exc)) from None
        when = f"{token.revoked_at:%Y-%m-%d %H:%M:%S} UTC"
        self.stdout.write(f"token {token.name} revoked ({when} by {token.revoked_by})")
