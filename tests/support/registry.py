"""A real private registry for the tests: Debian's ``docker-registry`` (distribution 2.8) on
127.0.0.1 of this host with htpasswd (bcrypt) auth, its storage in a temporary directory.

The private test dockerd pulls from it as any daemon would: docker treats registries on
127.0.0.0/8 as insecure-allowed, so plain HTTP on loopback needs no daemon option. Nothing
listens beyond loopback.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.support.servers import free_port


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:<port>
    username: str
    password: str

    @property
    def auth(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password}


@contextlib.contextmanager
def private_registry(username: str = "kici-ci", password: str = "reg-Pa55-secret"):
    """Run a registry until the block ends; yields its :class:`Registry`. Raises ``RuntimeError``
    naming what is missing (``docker-registry``, ``htpasswd``: scripts/test.sh installs both) or
    the registry's output when it does not answer."""
    for tool in ("docker-registry", "htpasswd"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} is not installed (scripts/test.sh installs docker-registry apache2-utils)")
    root = Path(tempfile.mkdtemp(prefix="kici-test-registry-"))
    port = free_port("127.0.0.1")
    htpasswd = subprocess.run(
        ["htpasswd", "-Bbn", username, password], check=True, capture_output=True, text=True
    ).stdout
    (root / "htpasswd").write_text(htpasswd)
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {{htpasswd: {{realm: kici-test, path: {root / 'htpasswd'}}}}}\n"
    )
    log = open(root / "registry.log", "wb")  # closed below
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 401:
                    break
            except (requests.ConnectionError, requests.Timeout):  # a loaded machine answers late
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not answer: {(root / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", username, password)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def foreign_rootfs() -> bytes:
    """A tarball of an image with no shell and no agent: only ``/etc/kici-test-marker``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"a job image made by the tests\n"
        info = tarfile.TarInfo("etc/kici-test-marker")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def push_test_image(api, registry: Registry, repository: str = "jobs/foreign", tag: str = "1") -> str:
    """Import :func:`foreign_rootfs` as ``<registry>/<repository>:<tag>``, push it with the
    registry's login, then remove it from the daemon (so a spawn must pull it). Returns the
    reference. Raises ``RuntimeError`` with the push's error."""
    name = f"{registry.host}/{repository}"
    api.import_image_from_data(foreign_rootfs(), repository=name, tag=tag)
    for chunk in api.push(name, tag=tag, auth_config=registry.auth, stream=True, decode=True):
        if chunk.get("error"):
            raise RuntimeError(f"push of {name}:{tag} failed: {chunk['error']}")
    api.remove_image(f"{name}:{tag}", force=True)
    return f"{name}:{tag}"
