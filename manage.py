#!/usr/bin/env python
"""Django's command-line utility for the KiCI Scaler Console.

A command that recorded events (``stop_agents``, ``operations approve --run-now``, an import)
pushes them live from a daemon thread; the process waits for those pushes (at most 5 s) before
it exits, or open pages would keep showing what the command changed.
"""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kici_site.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    finally:
        if "agents" in sys.modules:  # Django was set up: events may wait to be pushed
            from agents.events import flush_events

            flush_events(timeout=5.0)


if __name__ == "__main__":
    main()
