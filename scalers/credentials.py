"""Private registry credentials: encrypting their secrets and resolving them at pull time.

A :class:`~scalers.models.RegistryCredential` is a named login (``credentialsRef``) for one
registry host. Its secret is a Fernet token (AES-128-CBC with HMAC-SHA256, ``cryptography``) under
``KICI_SECRETS_KEY``; it is decrypted only by :func:`auth_config`, just before a pull, and the
plain text is never logged, shown or returned. Design: ``docs/registry-credentials.md``.
"""

from __future__ import annotations

import re

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from docker.auth import resolve_repository_name
from docker.errors import InvalidRepository

from lib.wording import json_text

from .models import RegistryCredential

MAX_IMAGE_LENGTH = 500

_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
#: An image reference as docker parses it: ``[registry/]path[:tag][@digest]``.
IMAGE_REFERENCE = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?")
#: A registry host as a credential names it: ``host[:port]``, no scheme and no path.
REGISTRY_HOST = re.compile(rf"{_DOMAIN}")
_DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}


class CredentialError(ValueError):
    """A credential cannot be used: unknown name, wrong registry, no or another key. The message
    names the credential and never contains its secret."""


def _fernet() -> Fernet:
    key = settings.KICI_SECRETS_KEY
    if not key:
        raise CredentialError("KICI_SECRETS_KEY is not set: registry credentials cannot be stored or used")
    return Fernet(key.encode())


def encrypt_secret(plain: str) -> str:
    """The Fernet token of ``plain`` (a non-empty string) under ``KICI_SECRETS_KEY``.
    Raises :class:`CredentialError` without a key, ``ValueError`` for an empty secret."""
    if not isinstance(plain, str) or not plain:
        raise ValueError("secret must be a non-empty string")
    return _fernet().encrypt(plain.encode()).decode()


def decrypt_secret(credential: RegistryCredential) -> str:
    """The plain secret of ``credential``. Raises :class:`CredentialError` when it does not
    decrypt with the current key (the key was changed, or the row was edited by hand)."""
    return decrypt_text(credential.secret, f"registry credential {credential.name!r}")


def decrypt_text(ciphertext: str, what: str) -> str:
    """The plain text of a Fernet token written by :func:`encrypt_secret`. Raises
    :class:`CredentialError` naming ``what`` when there is no key or it does not decrypt."""
    try:
        return _fernet().decrypt(ciphertext.encode()).decode()
    except InvalidToken:
        raise CredentialError(
            f"the secret of {what} does not decrypt with KICI_SECRETS_KEY "
            "(was the key changed?); set the secret again in the admin"
        ) from None


def normalize_registry(host: str) -> str:
    """``host`` lower-cased, Docker Hub's aliases as ``docker.io``. Raises ``ValueError`` for
    anything but ``host[:port]``."""
    host = (host or "").strip().lower()
    if not REGISTRY_HOST.fullmatch(host):
        raise ValueError(f"registry must be a host or host:port without scheme or path, got {host!r:.80}")
    return "docker.io" if host in _DOCKER_HUB else host


def image_registry(image: str) -> str:
    """The registry host docker pulls ``image`` from (``docker.io`` for a bare name)."""
    try:
        registry, _ = resolve_repository_name(image)
    except InvalidRepository as exc:
        raise ValueError(f"image {image!r:.80} is not a valid reference: {exc}") from None
    return normalize_registry(registry)


def image_problem(image) -> str | None:
    """Why ``image`` is not an image reference docker would pull, or None."""
    if not isinstance(image, str) or not image:
        return f"must be a non-empty string, got {json_text(image)}"
    if len(image) > MAX_IMAGE_LENGTH:
        return f"must be at most {MAX_IMAGE_LENGTH} characters"
    if not IMAGE_REFERENCE.fullmatch(image):
        return f"must be an image reference ([registry/]name[:tag][@digest], lower-case name), got {json_text(image)}"
    return None


def credential_problem(ref: str, image: str) -> str | None:
    """Why credential ``ref`` cannot be used to pull ``image`` (unknown, or for another
    registry), or None. Reads the database; decrypts nothing."""
    credential = RegistryCredential.objects.filter(name=ref).first()
    if credential is None:
        return f"no registry credential named {ref!r}"
    wanted = image_registry(image)
    if normalize_registry(credential.registry) != wanted:
        return f"registry credential {ref!r} is for {credential.registry}, not for {wanted} (image {image})"
    return None


def auth_config(ref: str, image: str) -> dict[str, str]:
    """The docker SDK ``auth_config`` (``{"username", "password"}``) of credential ``ref`` for
    pulling ``image``. Raises :class:`CredentialError` naming ``ref`` when it is unknown, is for
    another registry than ``image``'s, or does not decrypt."""
    if problem := credential_problem(ref, image):
        raise CredentialError(problem)
    credential = RegistryCredential.objects.get(name=ref)
    return {"username": credential.username, "password": decrypt_secret(credential)}
