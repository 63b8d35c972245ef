from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "live"
    verbose_name = "Live streams"

    def ready(self):
        # These modules import models, which Django allows only once the app registry is ready.
        from django.contrib.auth.signals import user_logged_out

        from agents.events import event_committed
        from agents.heartbeats import agent_rows_changed
        from operations.models import operation_progress

        from .publish import publish_committed_event, send_agent_rows, send_operation_progress
        from .session import on_logged_out

        event_committed.connect(publish_committed_event, dispatch_uid="live.publish_committed_event")
        agent_rows_changed.connect(send_agent_rows, dispatch_uid="live.send_agent_rows")
        operation_progress.connect(send_operation_progress, dispatch_uid="live.send_operation_progress")
        user_logged_out.connect(on_logged_out, dispatch_uid="live.close_sockets_on_logout")
