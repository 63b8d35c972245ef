"""The async ``/scale`` view's hops to executor threads give their database connection back: no
request cycle closes one there, and a pooled connection an executor thread kept would be lost to
every other request of the process."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from scalers.api import _credential_problem


@pytest.mark.django_db(transaction=True)
def test_the_credential_check_leaves_no_connection_open_in_its_thread():
    left: list[object] = []

    def check() -> None:
        assert _credential_problem("nobody", "registry.example/app:1") == "no registry credential named 'nobody'"
        left.append(connection.connection)

    thread = threading.Thread(target=check)
    thread.start()
    thread.join(30)
    assert left == [None]
