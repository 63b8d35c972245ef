"""``manage.py ensure_agent_network``: create or find ``kici-agent-net`` on the local docker host.

``make run`` calls it before starting daphne, which binds the network's gateway (172.30.0.1) so
agents can dial the console there.
"""

import docker
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scalers.backends.docker_net import ISOLATED_NETWORK_GATEWAY, ISOLATED_NETWORK_NAME, ensure_isolated_network


class Command(BaseCommand):
    help = "Create (or find) the isolated agent network kici-agent-net (172.30.0.0/16)."

    def handle(self, *args, **options):
        try:
            client = docker.DockerClient(base_url=settings.DOCKER_HOST) if settings.DOCKER_HOST else docker.from_env()
            try:
                network_id = ensure_isolated_network(client)
            finally:
                client.close()
        except docker.errors.DockerException as exc:
            raise CommandError(f"cannot reach docker ({settings.DOCKER_HOST or 'local socket'}): {exc}") from exc
        self.stdout.write(f"{ISOLATED_NETWORK_NAME} {network_id[:12]} (gateway {ISOLATED_NETWORK_GATEWAY})")
