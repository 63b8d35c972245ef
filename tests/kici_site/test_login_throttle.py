"""Login throttling: repeated failed logins for one user name from one address are refused."""

import pytest
from django.contrib.auth import get_user_model

pytestmark = pytest.mark.django_db


def _login(client, password, address="127.0.0.1"):
    return client.post(
        "/accounts/login/", {"username": "alice", "password": password}, REMOTE_ADDR=address, follow=False
    )


def test_a_user_name_is_locked_after_the_failure_limit_even_with_the_right_password(client, settings):
    get_user_model().objects.create_user("alice", password="right-password")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, "wrong").status_code == 200  # the form again, with its error
    assert _login(client, "wrong").status_code == 429  # the failure that reaches the limit
    refused = _login(client, "right-password")
    assert refused.status_code == 429
    page = refused.content.decode()
    assert 'id="locked-out"' in page and "for 0:15:00" in page and "axes_reset" in page
    assert "_auth_user_id" not in client.session


def test_another_address_is_not_locked_out_by_someone_elses_failures(client, settings):
    get_user_model().objects.create_user("alice", password="right-password")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(client, "wrong", address="127.0.0.2")
    assert _login(client, "right-password", address="127.0.0.1").status_code == 302


def test_a_success_before_the_limit_resets_the_count(client, settings):
    get_user_model().objects.create_user("alice", password="right-password")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _login(client, "wrong")
    assert _login(client, "right-password").status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _login(client, "wrong")
    assert _login(client, "right-password").status_code == 302


def test_the_form_says_what_is_wrong_an_empty_field_or_the_credentials(client):
    get_user_model().objects.create_user("alice", password="right-password")
    empty = client.post("/accounts/login/", {"username": "", "password": ""}).content.decode()
    assert "Enter your username and password." in empty and "correct username" not in empty
    assert "Enter your password." in client.post("/accounts/login/", {"username": "alice"}).content.decode()
    wrong = _login(client, "wrong").content.decode()
    assert "Please enter a correct username and password" in wrong, wrong


def test_an_overlong_user_name_is_a_failed_login_not_a_server_error(client):
    answer = client.post("/accounts/login/", {"username": "u" * 300, "password": "x"}, REMOTE_ADDR="127.0.0.1")
    assert answer.status_code == 200 and "Please enter a correct username and password" in answer.content.decode()
    from axes.models import AccessAttempt

    assert AccessAttempt.objects.get().username == "u" * 255  # counted, under the stored part
