from django.apps import AppConfig
from django.db.models.signals import post_migrate

from .roles import sync_groups


def _sync_roles(sender, **kwargs):
    from django.apps import apps

    sync_groups(apps)


class OperationsConfig(AppConfig):
    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Operations"

    def ready(self):
        # After every migrate: view permissions of models added since join the groups.
        post_migrate.connect(_sync_roles, sender=self, dispatch_uid="operations.sync_roles")
        # kici_scaler_attention and the notices on /metrics (the registry is the scalers app's,
        # below this one).
        from scalers.metrics import REGISTRY
        from scalers.scrape import register_series

        from .attention import AttentionCollector
        from .notify import NOTICES_SERIES
        from .supervision import PROCESS_RESTARTS_SERIES

        REGISTRY.register(AttentionCollector())
        register_series(NOTICES_SERIES)
        register_series(PROCESS_RESTARTS_SERIES)
