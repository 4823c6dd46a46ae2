"""``sparkiq serve`` processes on 127.0.0.1 for cluster tests, and a changelog writer."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from sparkiq.changelog import Changelog
from tests import forked_python, http_calls
from tests.changelog.helpers import write_batch

FAST_FLAGS = ["--heartbeat-interval", "0.2", "--failure-timeout", "1.5"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """One ``sparkiq serve`` subprocess; ``kill()`` is SIGKILL, ``start()`` restarts it with
    the same id, port and local directory."""

    def __init__(
        self,
        state_dir: str,
        node_id: str,
        port: int,
        peers: list[str],
        log_dir: str,
        *,
        launcher: list[str] | None = None,
        extra: list[str] | None = None,
        host: str = "127.0.0.1",
        prefix: list[str] | None = None,
        verify: ssl.SSLContext | bool = True,
        **env: str,
    ) -> None:
        self.state_dir, self.node_id, self.port, self.peers = state_dir, node_id, port, peers
        # ``launcher`` runs ``sparkiq`` some other way (tests/faults wraps it); ``extra``
        # adds serve options (``--advertise``, ``--local-dir``, TLS files). ``prefix`` comes
        # before the launcher (``ip netns exec NS``: on another host, tests/hosts), ``host``
        # is the address it listens on; ``verify`` checks its certificate when it has one.
        self.launcher = launcher or [sys.executable, "-m", "sparkiq.cli"]
        self.prefix = prefix or []
        self.extra = extra or []
        self.host, self.verify = host, verify
        scheme = "https" if "--tls-cert" in self.extra else "http"
        self.url = f"{scheme}://{host}:{port}"
        self.log_path = os.path.join(log_dir, f"{node_id}.log")
        self.env = env
        self.process: forked_python.Process | None = None

    def start(self, token: str | None = None) -> ServeProcess:
        args = [
            *self.prefix, *self.launcher, "serve",
            "--state-dir", self.state_dir,
            "--node-id", self.node_id,
            "--listen", f"{self.host}:{self.port}",
            "--peers", ",".join(self.peers),
            *FAST_FLAGS,
            *self.extra,
        ]  # fmt: skip
        if token:
            args += ["--token", token]
        env = os.environ | {"PYTHONUNBUFFERED": "1"} | self.env
        with open(self.log_path, "ab") as log:
            self.process = forked_python.popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def wait_up(self, timeout: float = 120.0) -> None:
        # A deadline for a hang, not a speed target: on a loaded machine starting Python,
        # importing pyarrow and DuckDB and binding takes tens of seconds.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"{self.node_id} exited: {self.log()}")
            try:
                answer = http_calls.get(f"{self.url}/healthz", timeout=0.5, verify=self.verify)
                if answer.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{self.node_id} did not come up: {self.log()}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Up, then ``/readyz`` 200: every partition it hosts restored (a hang limit)."""
        self.wait_up(timeout)
        deadline = time.monotonic() + timeout
        while (
            http_calls.get(f"{self.url}/readyz", timeout=5, verify=self.verify).status_code != 200
        ):
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()[-3000:]


def wait_cluster(
    urls: list[str],
    members: int,
    timeout: float = 120.0,
    token: str | None = None,
    verify: ssl.SSLContext | bool = True,
) -> None:
    """Until every node sees ``members`` live nodes and is ready. On timeout the error says
    what each node last answered (whom it sees, and its readiness), to tell a membership
    that did not re-form from replicas that did not catch up. ``verify``: the nodes'
    certificates, when they serve https."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        ok = True
        for u in urls:
            try:
                options: dict[str, Any] = {"headers": headers, "timeout": 1, "verify": verify}
                nodes = http_calls.get(f"{u}/metadata", **options).json()["nodes"]
                ready = http_calls.get(f"{u}/readyz", **options)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                seen[u], ok = f"no answer ({exc!r})", False
                continue
            ids = sorted(str(n.get("node_id")) for n in nodes)
            seen[u] = f"sees {ids}, readyz {ready.status_code} {ready.text[:300]}"
            ok = ok and len(nodes) == members and ready.status_code == 200
        if ok:
            return
        time.sleep(0.1)
    report = "\n".join(f"  {u}: {what}" for u, what in seen.items())
    raise AssertionError(f"cluster did not reach {members} ready members; last seen:\n{report}")


def make_nodes(state_dir: str, log_dir: str, count: int) -> list[ServeProcess]:
    """``count`` nodes n0, n1, ... on free ports, all seeded by n0; none started yet."""
    ports = [free_port() for _ in range(count)]
    seed = f"127.0.0.1:{ports[0]}"
    return [
        ServeProcess(state_dir, f"n{i}", ports[i], [seed] if i else [], log_dir)
        for i in range(count)
    ]


def start_nodes(nodes: list[ServeProcess]) -> None:
    """Starts ``nodes`` and waits until each is up and they form one ready cluster."""
    for node in nodes:
        node.start()
    for node in nodes:
        node.wait_up()
    wait_cluster([n.url for n in nodes], len(nodes))


class BatchWriter(threading.Thread):
    """Commits a batch every ``interval`` s in which every key's ``n`` is the batch id, so
    any answer is checkable: a row must carry the batch id of the position it came with."""

    def __init__(self, changelog: Changelog, keys: list[str], interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.changelog, self.keys, self.interval = changelog, keys, interval
        self.stop_event = threading.Event()
        self.next_batch = 0

    def write_one(self) -> None:
        write_batch(self.changelog, self.next_batch, {k: self.next_batch for k in self.keys})
        self.next_batch += 1

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.write_one()

    def stop(self) -> None:
        self.stop_event.set()
        self.join()


def row_matches_position(store: str, partition: int, row: Any, position: Any) -> bool:
    return row is not None and row["n"] == position.to_map()[store][partition]
