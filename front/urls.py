"""Page routes of the operator console (the JSON APIs are in ``scalers.urls``):
mounted at ``/``."""

from django.urls import include, path, register_converter

from .views import (
    agent_list,
    agent_page,
    api_docs,
    audit,
    console,
    dashboard,
    event_feed,
    isolation,
    operations,
    scalers,
    shell,
    tokens,
    waiting,
)


class ScalerNameConverter:
    """A scaler name in a page path: never ``why-waiting``, the path of the "Why is this job
    waiting?" page, so the two can never be confused whatever the route order."""

    regex = r"(?!why-waiting(?:/|$))[^/]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(ScalerNameConverter, "scaler")

#: ``/operations/`` pages, reversed as ``operations:<name>``.
operation_patterns = [
    path("", operations.operation_list, name="list"),
    path("plan/", operations.operation_plan, name="plan"),
    path("approve/", operations.operation_bulk_approve, name="bulk_approve"),
    path("<int:pk>/", operations.operation_detail, name="detail"),
    path("<int:pk>/approve/", operations.operation_approve, name="approve"),
    path("<int:pk>/reject/", operations.operation_reject, name="reject"),
]

urlpatterns = [
    path("operations/", include((operation_patterns, "operations"))),
    path("scalers/", scalers.scaler_list, name="scaler_list"),
    path("scalers/why-waiting/", waiting.why_waiting, name="why_waiting"),
    path("scalers/<scaler:name>/", scalers.scaler_detail, name="scaler_detail"),
    path(
        "scalers/<scaler:name>/label-sets/<int:index>/host-access/",
        scalers.host_access_editor,
        name="host_access_editor",
    ),
    path(
        "scalers/<scaler:name>/label-sets/<int:index>/host-access/preview",
        scalers.host_access_preview,
        name="host_access_preview",
    ),
    path(
        "scalers/<scaler:name>/label-sets/<int:index>/host-access/apply",
        scalers.host_access_apply,
        name="host_access_apply",
    ),
    path("", dashboard.dashboard, name="dashboard"),
    path("agents/", agent_list.agent_list, name="agent_list"),
    path("agents/<str:agent_id>/", agent_page.agent_detail, name="agent_detail"),
    path("agents/<str:agent_id>/isolation/", isolation.agent_isolation, name="agent_isolation"),
    path("agents/<str:agent_id>/isolation/selftest", isolation.agent_selftest, name="agent_selftest"),
    path("agents/<str:agent_id>/console/", console.agent_console, name="agent_console"),
    path("agents/<str:agent_id>/console/<str:stream>/", console.agent_console, name="agent_console_stream"),
    path(
        "agents/<str:agent_id>/console/<str:stream>/download",
        console.agent_console_download,
        name="agent_console_download",
    ),
    path("agents/<str:agent_id>/console/<str:stream>/lines", console.agent_console_lines, name="agent_console_lines"),
    path(
        "agents/<str:agent_id>/console/<str:stream>/search", console.agent_console_search, name="agent_console_search"
    ),
    path("agents/<str:agent_id>/shell/", shell.agent_shell, name="agent_shell"),
    path("agents/<str:agent_id>/shell/transcript", shell.agent_shell_transcript, name="agent_shell_transcript"),
    path("events/", event_feed.event_list, name="event_list"),
    path("audit/", audit.audit_list, name="audit_list"),
    path("tokens/", tokens.token_list, name="token_list"),
    path("api-docs/", api_docs.api_docs, name="api_docs"),
    path("tokens/<str:name>/revoke/", tokens.token_revoke, name="token_revoke"),
]
