"""Registry credentials: the secret is encrypted at rest, write-only in the admin, and resolved
only for the registry it belongs to."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from lib.env import env_secrets_key
from scalers.credentials import (
    CredentialError,
    auth_config,
    decrypt_secret,
    encrypt_secret,
    image_problem,
    image_registry,
    normalize_registry,
)
from scalers.models import RegistryCredential

pytestmark = pytest.mark.django_db

PLAIN = "s3cret-Pa55word"


def _credential(name="reg", registry="127.0.0.1:5000", username="ci", plain=PLAIN) -> RegistryCredential:
    return RegistryCredential.objects.create(
        name=name, registry=registry, username=username, secret=encrypt_secret(plain)
    )


def test_the_secret_is_stored_encrypted_and_decrypts_with_the_key():
    cred = _credential()
    stored = RegistryCredential.objects.values_list("secret", flat=True).get(pk=cred.pk)
    assert PLAIN not in stored
    assert decrypt_secret(cred) == PLAIN


def test_another_key_cannot_read_it_and_the_error_names_the_credential(settings):
    cred = _credential(name="other-key")
    settings.KICI_SECRETS_KEY = Fernet.generate_key().decode()
    with pytest.raises(CredentialError, match="'other-key' does not decrypt") as exc:
        decrypt_secret(cred)
    assert PLAIN not in str(exc.value)


def test_without_a_key_nothing_is_encrypted(settings):
    settings.KICI_SECRETS_KEY = None
    with pytest.raises(CredentialError, match="KICI_SECRETS_KEY is not set"):
        encrypt_secret(PLAIN)


@pytest.mark.parametrize("raw", ["short", "x" * 44, "not base64 !!"])
def test_a_malformed_key_stops_start_up_without_echoing_it(monkeypatch, raw):
    monkeypatch.setenv("KICI_SECRETS_KEY", raw)
    with pytest.raises(ImproperlyConfigured, match="KICI_SECRETS_KEY is not a Fernet key") as exc:
        env_secrets_key("KICI_SECRETS_KEY")
    assert raw not in str(exc.value)


def test_a_generated_key_is_accepted(monkeypatch):
    key = Fernet.generate_key().decode()
    monkeypatch.setenv("KICI_SECRETS_KEY", key)
    assert env_secrets_key("KICI_SECRETS_KEY") == key


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("127.0.0.1:5000/job/x:1", "127.0.0.1:5000"),
        ("busybox", "docker.io"),
        ("index.docker.io/library/debian:12", "docker.io"),
        ("Registry.Example.com/a/b@sha256:" + "0" * 64, "registry.example.com"),
    ],
)
def test_the_registry_of_an_image(image, registry):
    assert image_problem(image) is None
    assert image_registry(image) == registry


@pytest.mark.parametrize("image", ["", "library/UPPER", "a b", "x:", "https://r.example/x", "-x", 5, None])
def test_image_references_docker_would_refuse_are_named(image):
    assert image_problem(image)


@pytest.mark.parametrize("host", ["https://r.example", "r.example/path", "", "r.example:port"])
def test_a_registry_is_a_host_and_port_only(host):
    with pytest.raises(ValueError, match="registry must be a host"):
        normalize_registry(host)


def test_auth_config_for_the_credentials_own_registry():
    _credential()
    assert auth_config("reg", "127.0.0.1:5000/job/x:1") == {"username": "ci", "password": PLAIN}


def test_auth_config_refuses_an_unknown_name_and_another_registry():
    _credential()
    with pytest.raises(CredentialError, match="no registry credential named 'nope'"):
        auth_config("nope", "127.0.0.1:5000/job/x:1")
    with pytest.raises(CredentialError, match="'reg' is for 127.0.0.1:5000, not for docker.io") as exc:
        auth_config("reg", "busybox:latest")
    assert PLAIN not in str(exc.value)


# --- the admin ------------------------------------------------------------------------------------


def _form(**overrides) -> dict:
    return {"name": "ci-reg", "registry": "127.0.0.1:5000", "username": "ci", "new_secret": PLAIN} | overrides


def test_the_admin_creates_a_credential_with_its_secret_encrypted(admin_client):
    response = admin_client.post(reverse("admin:scalers_registrycredential_add"), _form())
    assert response.status_code == 302, response.content[:2000]
    cred = RegistryCredential.objects.get(name="ci-reg")
    assert cred.secret and PLAIN not in cred.secret
    assert decrypt_secret(cred) == PLAIN


def test_a_new_credential_needs_a_secret_and_a_plain_registry_host(admin_client):
    url = reverse("admin:scalers_registrycredential_add")
    page = admin_client.post(url, _form(new_secret=""))
    assert page.status_code == 200 and b"a new credential needs its secret" in page.content
    page = admin_client.post(url, _form(registry="https://127.0.0.1:5000/v2"))
    assert page.status_code == 200 and b"registry must be a host" in page.content
    assert not RegistryCredential.objects.exists()


def test_the_secret_is_never_shown_back(admin_client):
    cred = _credential(name="shown")
    for url in (
        reverse("admin:scalers_registrycredential_change", args=[cred.pk]),
        reverse("admin:scalers_registrycredential_changelist"),
        reverse("admin:scalers_registrycredential_history", args=[cred.pk]),
    ):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert PLAIN.encode() not in page.content and cred.secret.encode() not in page.content


def test_editing_without_a_secret_keeps_it_and_a_new_one_replaces_it(admin_client):
    cred = _credential(name="kept")
    url = reverse("admin:scalers_registrycredential_change", args=[cred.pk])
    assert admin_client.post(url, _form(name="kept", username="ci2", new_secret="")).status_code == 302
    cred.refresh_from_db()
    assert cred.username == "ci2" and decrypt_secret(cred) == PLAIN
    assert admin_client.post(url, _form(name="kept", new_secret="rotated")).status_code == 302
    cred.refresh_from_db()
    assert decrypt_secret(cred) == "rotated"
