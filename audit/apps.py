from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The console-wide audit trail: who did what, when, to which scaler, operation or agent."""

    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import logins

        logins.connect()
