"""The operator server's HTTP factory (``kici_site.operator_server.OperatorHTTPFactory``): twisted's
own access line, formatted for every request and sent nowhere by daphne, is not written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own: importing daphne's server installs twisted's reactor.
PROBE = """
import io
from daphne import http_protocol
from kici_site.operator_server import OperatorHTTPFactory

for factory_class in (http_protocol.HTTPFactory, OperatorHTTPFactory):
    factory = factory_class(server=None)
    factory._logFile = io.StringIO()
    factory._logFormatter = lambda timestamp, request: "a request"
    factory.log(request=None)
    print(factory_class.__name__, repr(factory._logFile.getvalue()))
"""


def test_twisted_writes_no_access_line_of_its_own():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kici_site.settings_test"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["HTTPFactory 'a request\\n'", "OperatorHTTPFactory ''"], done.stdout
