"""N ``sparkiq serve --membership gossip`` processes on this host, for
bench/membership_processes.py.

Each member is a real node in a process of its own over HTTP on 127.0.0.1 (the same
``sparkiq serve`` a deployment runs), seeded with the first member, sharing one state_dir
whose table ``t`` they host. What a process says of itself is read from the outside: its
messages and bytes from its ``/metrics`` (``sparkiq_heartbeats_total`` counts gossip
probes sent and answered, ``sparkiq_membership_bytes_total`` their bytes), its live view
from ``/metadata`` (one entry per live member), its CPU and memory from
``/proc/<pid>/stat`` and ``/proc/<pid>/smaps_rollup``, the partitions it opened and the
members it saw leave from the lines of its log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from bench import _common
from bench._common import seconds_until
from bench.http import _free_port

__all__ = ["Member", "ServeCluster", "Traffic"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Traffic:
    """What one member has sent since it started: messages (requests sent and replies
    given), their bytes, and the CPU-seconds of its process."""

    messages: float
    bytes: float
    cpu_s: float


class Member:
    """One ``sparkiq serve`` process (started by :meth:`ServeCluster.start`)."""

    def __init__(self, node_id: str, port: int, process: subprocess.Popen[bytes], log: str):
        self.node_id = node_id
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
        self.log = log

    def cpu_s(self) -> float:
        """CPU-seconds (user and system) of the process so far."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime

    def private_mb(self) -> float:
        """Memory of the process's own (MB): its resident pages no other process shares.
        Its resident size also counts the libraries' pages, which every member shares
        (about 90 MB of a member's 180 here), so N members need about N times this."""
        with open(f"/proc/{self.process.pid}/smaps_rollup") as rollup:
            text = rollup.read()
        kb = sum(int(k) for k in re.findall(r"^Private_(?:Clean|Dirty):\s+(\d+) kB", text, re.M))
        return kb / 1024

    def opened(self) -> int:
        """Partitions this member started hosting so far (its log's ``now hosting``)."""
        return self._lines(": now hosting ")

    def drops(self) -> int:
        """Times members left this member's live view so far (suspected, left or dead)."""
        return self._lines(" left (or are unreachable)")

    def _lines(self, text: str) -> int:
        with open(self.log, errors="replace") as log:
            return sum(1 for line in log if text in line)


class ServeCluster:
    """Gossip members as processes: ``ids`` in order, the first the others' seed."""

    def __init__(self, state_dir: str, log_dir: str, *, interval: float, failure: float) -> None:
        self.state_dir, self.log_dir = state_dir, log_dir
        self.interval, self.failure = interval, failure
        self.members: dict[str, Member] = {}
        self.gone: list[Member] = []  # left or killed: reaped on stop
        self.http = httpx.Client(timeout=10)
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="bench-poll")
        self._seed: str | None = None

    def start(self, node_id: str) -> Member:
        """Start one member (not waiting for it)."""
        port = _free_port()
        log = os.path.join(self.log_dir, f"{node_id}.log")
        command = [
            sys.executable, "-m", "sparkiq.cli", "serve", "--state-dir", self.state_dir,
            "--node-id", node_id, "--listen", f"127.0.0.1:{port}",
            "--peers", self._seed or "", "--membership", "gossip",
            "--heartbeat-interval", str(self.interval), "--failure-timeout", str(self.failure),
        ]  # fmt: skip
        with open(log, "wb") as out:
            process = _common.start_python(command, stdout=subprocess.DEVNULL, stderr=out)
        if self._seed is None:
            self._seed = f"127.0.0.1:{port}"
        member = Member(node_id, port, process, log)
        self.members[node_id] = member
        return member

    def answers(self, member: Member) -> bool:
        """Whether the member's HTTP server answers (its process is up and serving)."""
        try:
            return self.http.get(f"{member.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_answering(self, member: Member, limit: float) -> float | None:
        """Seconds until ``member`` answers /healthz; None after ``limit``."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            if member.process.poll() is not None:
                raise RuntimeError(
                    f"{member.node_id} exited ({member.process.returncode}): see {member.log}"
                )
            if self.answers(member):
                return time.monotonic() - started
            time.sleep(0.05)
        return None

    def view(self, member: Member) -> tuple[str, ...] | None:
        """The member's live view (None: it did not answer)."""
        try:
            doc = self.http.get(f"{member.url}/metadata").json()
            return tuple(sorted(n["node_id"] for n in doc["nodes"]))
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def agreed(self) -> bool:
        """Whether every running member's live view is exactly the running members."""
        want = tuple(sorted(self.members))
        views = self._pool.map(self.view, list(self.members.values()))
        return all(v == want for v in views)

    def ready(self) -> bool:
        """Whether every running member hosts what it is assigned, live (/readyz 200)."""

        def one(member: Member) -> bool:
            try:
                return self.http.get(f"{member.url}/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        return all(self._pool.map(one, list(self.members.values())))

    def wait(self, check: str, limit: float, since: float | None = None) -> float | None:
        """Seconds from ``since`` (default: now) until ``check`` holds; None after ``limit``."""
        return seconds_until(getattr(self, check), limit, since)

    def traffic(self) -> dict[str, Traffic]:
        """Every running member's counts now (members that did not answer left out)."""

        def one(member: Member) -> tuple[str, Traffic | None]:
            cpu = member.cpu_s()
            try:
                text = self.http.get(f"{member.url}/metrics").text
            except httpx.HTTPError:
                return member.node_id, None
            beats = _labelled(text, "sparkiq_heartbeats_total")
            sizes = _labelled(text, "sparkiq_membership_bytes_total")
            messages = beats.get("sent", 0.0) + beats.get("received", 0.0)
            return member.node_id, Traffic(messages, sizes.get("sent", 0.0), cpu)

        found = self._pool.map(one, list(self.members.values()))
        return {node_id: t for node_id, t in found if t is not None}

    def leave(self, node_id: str) -> None:
        """A planned leave: SIGTERM, on which a node announces its leave and stops."""
        member = self.members.pop(node_id)
        member.process.send_signal(signal.SIGTERM)
        self.gone.append(member)

    def kill(self, node_id: str) -> None:
        """kill -9: the process ends at once, announcing nothing."""
        member = self.members.pop(node_id)
        member.process.kill()
        self.gone.append(member)

    def stop(self) -> None:
        everyone = [*self.members.values(), *self.gone]
        for member in everyone:
            if member.process.poll() is None:
                member.process.terminate()
        for member in everyone:
            try:
                member.process.wait(15)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()
        self.members.clear()
        self.gone.clear()
        self._pool.shutdown()
        self.http.close()


def _labelled(metrics: str, name: str) -> dict[str, float]:
    """The samples of ``name`` by the value of their one label."""
    return {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{")
    }


def available_mb() -> float:
    """MemAvailable of this host, MB."""
    with open("/proc/meminfo") as meminfo:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read(), re.M)
    return int(found.group(1)) / 1024 if found else 0.0
