"""Operator pages for agents: dashboard, agents list, agent page, console page, events feed.

Every page needs a signed-in user with ``agents.view_agent`` (anonymous users are sent to the login
page, signed-in users without the permission get 403). htmx requests (not boosted) get the named
partial of the same template instead of the whole page, so a table re-fetch and the first render
share their markup.

One module per page (every name is importable from ``agents.views``): :mod:`~agents.views.dashboard`,
:mod:`~agents.views.agent_list`, :mod:`~agents.views.agent_page` with its fragments in
:mod:`~agents.views.isolation`, :mod:`~agents.views.console` and :mod:`~agents.views.event_feed`;
the access and htmx helpers are in :mod:`~agents.views.common`.
"""

from .agent_list import LIST_PAGE_SIZE, STATE_FILTERS, agent_list, filter_agents
from .agent_page import agent_detail, host_access_view, ops_request_available
from .common import (
    SELFTEST_PERMS,
    VIEW_PERM,
    agent_or_404,
    can_run_selftest,
    css_attr_selector,
    template_exists,
    viewer_required,
    wants_partial,
)
from .console import agent_console, agent_console_download, console_streams, download_url
from .dashboard import DASHBOARD_AGENT_LIMIT, DASHBOARD_EVENT_LIMIT, RECOVERY_COUNTS, dashboard, recovery_report
from .event_feed import EVENTS_PAGE_SIZE, event_list
from .isolation import agent_isolation, agent_selftest, selftest_function, selftest_rows

__all__ = [
    "DASHBOARD_AGENT_LIMIT",
    "DASHBOARD_EVENT_LIMIT",
    "EVENTS_PAGE_SIZE",
    "LIST_PAGE_SIZE",
    "RECOVERY_COUNTS",
    "SELFTEST_PERMS",
    "STATE_FILTERS",
    "VIEW_PERM",
    "agent_console",
    "agent_console_download",
    "agent_detail",
    "agent_isolation",
    "agent_list",
    "agent_or_404",
    "agent_selftest",
    "can_run_selftest",
    "console_streams",
    "css_attr_selector",
    "dashboard",
    "download_url",
    "event_list",
    "filter_agents",
    "host_access_view",
    "ops_request_available",
    "recovery_report",
    "selftest_function",
    "selftest_rows",
    "template_exists",
    "viewer_required",
    "wants_partial",
]
