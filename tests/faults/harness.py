"""A writer, N ``sparkiq serve`` nodes behind TCP proxies, client load, and fault injectors.

:class:`FaultCluster` starts, under ``root``:

- the writer process (:mod:`tests.faults.writer`), committing the model's batches;
- one proxy per node (:mod:`tests.faults.proxy`): each node advertises its proxy's address,
  so nodes reach each other, and clients reach nodes, only through the proxies;
- N nodes (:class:`~tests.cluster.serve_processes.ServeProcess`, launched through
  :mod:`tests.faults.faulty_serve`), each reading the changelog through a
  :class:`~tests.faults.faultfs.FaultyFileSystem` of its own; node ``disk_node``, if given,
  keeps its replicas on a small tmpfs that :meth:`FaultCluster.full_disk` fills up;
- :class:`~tests.faults.history.Loader` sessions, one per node, each preferring its node.

Each injector applies a fault, holds it, heals it, waits until the cluster is whole and ready
again and returns a :class:`~tests.faults.checker.Fault` with the three times, for
:func:`~tests.faults.checker.windows`. Every wait is on a condition with a generous deadline
(a hang bound, not a speed target: a loaded 2-core machine starts a node in tens of seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkiq.stores.history import History
from tests import forked_python
from tests.changelog.helpers import make_table
from tests.cluster.cluster_helpers import wait_until
from tests.cluster.serve_processes import ServeProcess, free_port, wait_cluster
from tests.faults.checker import Anomaly, Fault, Window, check_changelog, check_history, windows
from tests.faults.faultfs import Faults
from tests.faults.history import Loader, Op
from tests.faults.model import PARTITIONS, Model
from tests.small_disk import fill, mount_tmpfs, unmount

STARTUP = 180.0  # a hang bound for starting processes on a loaded machine
SETTLE = 120.0  # a hang bound for the cluster to be whole and ready after a fault
DISK_MB = 48
#: The repository root: the helper processes run ``python -m tests.faults.*`` from it.
REPO = str(Path(__file__).resolve().parents[2])


class FaultCluster:
    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        *,
        writer_interval: float = 0.1,
        disk_node: int | None = None,
        loaders: int | None = None,
        load_pause: float = 0.0,
        history: History | None = None,
        seed: int = 1,
    ) -> None:
        self.root = root
        self.state_dir = str((root / "state").absolute())
        self.count, self.writer_interval, self.seed = nodes, writer_interval, seed
        self.disk_node = disk_node
        self.disk_error = ""  # why the tmpfs could not be mounted, if it could not
        self.loader_count = nodes if loaders is None else loaders
        self.load_pause = load_pause  # seconds each session waits between operations
        self.history = history  # the table's history window, if not the default
        self.rng = random.Random(seed)
        self.proxy_control = str(root / "proxy.json")
        self.writer_control = str(root / "writer-fs.json")
        self.pids: dict[str, int] = {}
        self.rules: list[dict[str, Any]] = []
        self.faults: list[Fault] = []
        self.loaders: list[Loader] = []  # the sessions of the latest start_load()
        self.sessions = 0
        self.processes: list[forked_python.Process] = []
        self.writer: forked_python.Process | None = None
        self.writer_kills = 0
        self.mid_batch_kills = 0
        self.mounted: list[str] = []
        self.nodes: list[ServeProcess] = []
        self.proxy_ports: list[int] = []
        # What waiting on the nodes needs when they ask for a token or serve https
        # (tests/hosts): the clients' token, and how to verify their certificates.
        self.token: str | None = None
        self.verify: ssl.SSLContext | bool = True

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FaultCluster:
        self.start_writer_and_table()
        self.start_nodes()
        return self

    def start_writer_and_table(self) -> None:
        """The table ``t``, and the writer, once it committed its first batch."""
        changelog = make_table(self.state_dir, partitions=PARTITIONS)
        if self.history is not None:
            manifest = replace(changelog.manifest(), history=self.history)
            manifest.ensure_written(changelog.storage, changelog.manifest_path)
        Faults().write(self.writer_control)
        self._write_rules()
        self.start_writer()
        wait_until(lambda: self.head() >= 0, STARTUP, "the writer committed no batch")

    def start_nodes(self) -> None:
        """The proxies and the nodes behind them, until they form one ready cluster."""
        ports = [free_port() for _ in range(self.count)]
        self.proxy_ports = [free_port() for _ in range(self.count)]
        routes = [f"n{i}={self.proxy_ports[i]}:{ports[i]}" for i in range(self.count)]
        self._spawn(
            [sys.executable, "-m", "tests.faults.proxy", self.proxy_control, *routes], "proxy"
        )
        seed = f"127.0.0.1:{self.proxy_ports[0]}"
        for i in range(self.count):
            node_id = f"n{i}"
            control = str(self.root / f"{node_id}-fs.json")
            Faults().write(control)
            local_dir = self.root / f"local-{node_id}"
            local_dir.mkdir()
            if i == self.disk_node:
                self._mount_tmpfs(local_dir)
            launcher = [sys.executable, "-m", "tests.faults.faulty_serve", control, str(i)]
            extra = ["--advertise", self.proxy_url(i), "--local-dir", str(local_dir)]
            self.nodes.append(
                ServeProcess(
                    self.state_dir,
                    node_id,
                    ports[i],
                    [seed] if i else [],
                    str(self.root),
                    launcher=launcher,
                    extra=extra,
                    # this checkout's sources first: a git worktree tests its own code
                    PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]),
                )
            )
        for node in self.nodes:
            node.start()
        self._note_pids()  # before they connect to each other, so the proxies know them
        for node in self.nodes:
            node.wait_up(timeout=STARTUP)
        self.wait_whole(STARTUP)

    def wait_whole(self, timeout: float) -> None:
        """Until every node sees all the others and is ready."""
        urls = [n.url for n in self.nodes]
        wait_cluster(urls, self.count, timeout=timeout, token=self.token, verify=self.verify)

    def start_load(self) -> None:
        urls = [self.proxy_url(i) for i in range(self.count)]
        self.sessions += 1
        self.loaders = []
        for i in range(self.loader_count):
            mine = urls[i % self.count]
            self.loaders.append(
                Loader(
                    f"s{self.sessions}c{i}",
                    [mine, *(u for u in urls if u != mine)],
                    self.seed * 1000 + self.sessions * 10 + i,
                    pause=self.load_pause,
                )
            )
        for loader in self.loaders:
            loader.start()

    def stop_load(self) -> list[Op]:
        return [op for loader in self.loaders for op in loader.stop()]

    def close(self) -> None:
        for loader in self.loaders:
            loader.stop_event.set()
        for node in self.nodes:  # all asked to stop at once: each takes seconds when loaded
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)  # never leave a stopped process
                node.process.terminate()
        for node in self.nodes:
            node.stop()
        for process in [*self.processes, *([self.writer] if self.writer else [])]:
            if process.poll() is None:
                process.kill()
                process.wait()
        for mount in self.mounted:
            unmount(mount)

    def __enter__(self) -> FaultCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what clients and the checker need ---------------------------------------------------

    def proxy_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.proxy_ports[i]}"

    def head(self) -> int:
        """The newest committed batch (-1 before the first)."""
        try:
            names = os.listdir(Path(self.state_dir) / "tables" / "t" / "commits")
        except FileNotFoundError:
            return -1
        return max((int(n[:20]) for n in names if n.endswith(".json") and n[0] != "."), default=-1)

    def verdict(self, ops: list[Op]) -> tuple[list[Anomaly], list[Window]]:
        """Every anomaly in ``ops`` and in the changelog, and the windows of every fault."""
        head, anomalies = check_changelog(self.state_dir)
        anomalies += check_history(ops, Model(), head)
        return anomalies, windows(ops, self.faults)

    # -- injectors -----------------------------------------------------------------------------

    def inject(
        self, name: str, apply: Callable[[], None], heal: Callable[[], None], hold: float
    ) -> Fault:
        start = time.monotonic()
        apply()
        time.sleep(hold)
        heal()
        healed = time.monotonic()
        self.settle()
        fault = Fault(name, start, healed, time.monotonic())
        self.faults.append(fault)
        return fault

    def kill_node(self, i: int, hold: float = 3.0) -> Fault:
        node = self.nodes[i]
        return self.inject(f"kill -9 {node.node_id}", node.kill, lambda: self._restart(i), hold)

    def pause_node(self, i: int, hold: float = 5.0) -> Fault:
        process = self.nodes[i].process
        assert process is not None
        return self.inject(
            f"SIGSTOP {self.nodes[i].node_id} {hold:g} s",
            lambda: process.send_signal(signal.SIGSTOP),
            lambda: process.send_signal(signal.SIGCONT),
            hold,
        )

    def isolate_node(
        self, i: int, mode: str = "blackhole", hold: float = 5.0, *, one_way: bool = False
    ) -> Fault:
        """A partition: nothing reaches node ``i`` or leaves it (nodes and clients alike).
        ``one_way``: only what is sent *to* node ``i`` is lost; its own heartbeats still
        reach the others, so they keep counting it live while it answers nothing."""
        node_id = self.nodes[i].node_id
        rules = [{"src": "*", "dst": node_id, "mode": mode}]
        if not one_way:
            rules.insert(0, {"src": node_id, "dst": "*", "mode": mode})
        return self.inject(
            f"partition {node_id} ({mode}{', one way' if one_way else ''})",
            lambda: self._write_rules(rules),
            lambda: self._write_rules([]),
            hold,
        )

    def slow_network(self, seconds: float = 0.3, hold: float = 5.0) -> Fault:
        """Every chunk between nodes, and from clients, waits ``seconds``."""
        rules = [{"src": "*", "dst": "*", "mode": "delay", "seconds": seconds}]
        return self.inject(
            f"network delay {seconds:g} s",
            lambda: self._write_rules(rules),
            lambda: self._write_rules([]),
            hold,
        )

    def store_faults(self, faults: Faults, hold: float = 5.0, *, writer: bool = False) -> Fault:
        """The changelog store misbehaves for every node (or, ``writer``, for the writer)."""
        controls = (
            [self.writer_control]
            if writer
            else [str(self.root / f"{n.node_id}-fs.json") for n in self.nodes]
        )
        who = "writer" if writer else "nodes"

        def apply() -> None:
            for control in controls:
                faults.write(control)

        def heal() -> None:
            for control in controls:
                Faults().write(control)

        return self.inject(f"store {who} {_describe(faults)}", apply, heal, hold)

    def kill_writer(self, times: int = 3, pause: float = 0.5) -> Fault:
        """``kill -9`` the writer at random moments (throttled storage makes most of them
        land inside a batch), restarting it each time."""

        def apply() -> None:
            Faults(delay=0.01).write(self.writer_control)
            for _ in range(times):
                # wait until the (re)started writer commits, so the kill lands while it
                # writes, not while Python starts
                head = self.head()
                wait_until(lambda h=head: self.head() > h, STARTUP, "the writer is stuck")
                time.sleep(self.rng.uniform(0.05, 0.4))
                assert self.writer is not None
                self.writer.kill()
                self.writer.wait()
                self.writer_kills += 1
                if self._inside_a_batch():
                    self.mid_batch_kills += 1
                time.sleep(pause)
                self.start_writer()

        def heal() -> None:
            Faults().write(self.writer_control)

        return self.inject(f"writer kill -9 x{times}", apply, heal, 0.0)

    def full_disk(self, i: int, hold: float = 5.0) -> Fault:
        """Fill the tmpfs under node ``i``'s replicas, then free it."""
        under = self.root / f"local-{self.nodes[i].node_id}"
        filler = under / "filler"

        def apply() -> None:
            try:
                fill(under)
            except OSError as exc:  # full before the fault: say with what
                raise AssertionError(f"{under}: {exc}; it holds {_usage(under)}") from None

        def heal() -> None:
            filler.unlink(missing_ok=True)
            if self.nodes[i].process is not None and self.nodes[i].process.poll() is not None:
                self._restart(i)  # a node that stopped on ENOSPC is started again (reported)

        return self.inject(f"full disk under {self.nodes[i].node_id}", apply, heal, hold)

    # -- plumbing ------------------------------------------------------------------------------

    def settle(self) -> None:
        for node in self.nodes:
            assert node.process is not None
            if node.process.poll() is not None:
                raise AssertionError(f"{node.node_id} exited: {node.log()}")
        try:
            self.wait_whole(SETTLE)
        except AssertionError as exc:  # what each node said of the others, to find out why
            logs = "\n".join(f"--- {n.node_id}:\n{_events(n.log_path)}" for n in self.nodes)
            raise AssertionError(f"{exc}\n{logs}\n--- proxy rules: {self.rules}") from None
        head = self.head()
        wait_until(lambda: self.head() > head, SETTLE, "the writer stopped committing")

    def start_writer(self) -> None:
        args = [
            sys.executable,
            "-m",
            "tests.faults.writer",
            self.state_dir,
            "--control",
            self.writer_control,
            "--interval",
            str(self.writer_interval),
            "--seed",
            str(self.writer_kills),
        ]
        with open(self.root / "writer.log", "ab") as log:
            self.writer = forked_python.popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def _inside_a_batch(self) -> bool:
        """Whether the next batch has files written but no commit record (a torn batch)."""
        table = Path(self.state_dir) / "tables" / "t"
        following = f"{self.head() + 1:020d}"
        segments = [table / "segments" / f"{p:05d}" for p in range(PARTITIONS)]
        return any((d / f"{following}.arrow").exists() for d in segments) or any(
            following in name for d in [*segments, table / "commits"] for name in _names(d)
        )

    def _restart(self, i: int) -> None:
        self.nodes[i].start()
        self._note_pids()
        self.nodes[i].wait_up(timeout=STARTUP)

    def _spawn(self, args: list[str], name: str) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.processes.append(
                forked_python.popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            )

    def _note_pids(self) -> None:
        self.pids = {n.node_id: n.process.pid for n in self.nodes if n.process is not None}
        self._write_rules(self.rules)

    def _write_rules(self, rules: list[dict[str, Any]] | None = None) -> None:
        self.rules = rules or []
        tmp = f"{self.proxy_control}.tmp"
        with open(tmp, "w") as handle:
            json.dump({"pids": self.pids, "rules": self.rules}, handle)
        os.replace(tmp, self.proxy_control)

    def _mount_tmpfs(self, path: Path) -> None:
        self.disk_error = mount_tmpfs(path, DISK_MB)
        if not self.disk_error:
            self.mounted.append(str(path))


def _events(log_path: str | Path, lines: int = 60) -> str:
    """The last ``lines`` events of a node's log (membership changes, hosting, routing);
    restore progress lines (one per partition every 2 s) are left out but the last."""
    with open(log_path, errors="replace") as handle:
        kept = handle.readlines()
    progress = [line for line in kept if "restoring, batch" in line]
    events = [line for line in kept if "restoring, batch" not in line]
    return "".join(events[-lines:] + progress[-4:])


def _usage(root: Path) -> str:
    """The largest directories under ``root`` with their sizes (a full disk's culprits)."""
    sizes: dict[str, int] = {}
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                top = path.relative_to(root).parts[:3]
                sizes["/".join(top)] = sizes.get("/".join(top), 0) + path.stat().st_size
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:12]
    return ", ".join(f"{name} {size >> 10} KiB" for name, size in largest) or "nothing"


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _describe(faults: Faults) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in vars(faults).items() if v) or "none"
