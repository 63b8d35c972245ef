"""``python manage.py stop_agents``: end every active agent this console instance runs locally.

A console restart leaves its agents running; this is how an operator ends them on purpose
(``make stop-agents``, docs/recovery.md "Ending the agents on purpose"). Each active agent of a
local scaler of this host owned by ``settings.KICI_INSTANCE_ID`` is torn down the ordinary way
(``scalers.lifecycle.teardown_agent``), whether the console's processes run or not. Prints one
line per agent; exits 1 when a teardown failed (it stays ``destroying`` for a retry).
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agents.choices import ACTIVE_STATES, TERMINAL_STATES
from agents.models import Agent
from scalers.choices import LOCAL_SCALER_TYPES
from scalers.lifecycle import teardown_agent
from scalers.models import this_host

REASON = "stopped by the operator (manage.py stop_agents)"


class Command(BaseCommand):
    help = "Tear down every active agent of this console instance's local scalers (containers, VMs, processes)."

    def handle(self, *args, **options):
        agents = list(
            Agent.objects.select_related("scaler")
            .filter(
                owner_instance=settings.KICI_INSTANCE_ID,
                scaler__host=this_host(),
                state__in=ACTIVE_STATES,
                scaler__type__in=sorted(LOCAL_SCALER_TYPES),
            )
            .order_by("pk")
        )
        failed = []
        for agent in agents:
            teardown_agent(agent, REASON, destroy_reason="shutdown", hold=False)
            state = Agent.objects.filter(pk=agent.pk).values_list("state", flat=True).get()
            if state not in TERMINAL_STATES:
                failed.append(agent.agent_id)
            self.stdout.write(f"{agent.agent_id} ({agent.scaler.name}): {state}")
        self.stdout.write(f"{len(agents) - len(failed)} of {len(agents)} agent(s) ended")
        if failed:
            raise CommandError(f"could not tear down {', '.join(failed)}; they stay destroying, the sweeper retries")
