"""Failover: how long a killed node's partitions go unanswered under continuous queries.

Three ``sparkiq serve`` processes (one standby per partition) serve a table that a writer
updates every 50 ms. A client queries random keys through one node without pause. The node
that is active for the most partitions (never the one the client talks to) is killed with
SIGKILL; for each partition it was active for, the failover time is from the kill to the
first successful answer for that partition. Every answer is also checked: its row must
carry the batch id of the position it was served at. The node is restarted and the cluster
settles before the next round.

Run: ``python -m bench.failover [--quick | --smoke]``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from bench import _common
from bench._changelog import as_arrow, key_name, open_table
from bench._common import (
    Report,
    Scale,
    entry_point,
    median,
    percentile,
    polling_client,
    scratch_dir,
    verdict,
)
from bench.http import _free_port, _stop, _wait
from sparkiq import Client, KeyQuery, StateQueryRequest
from sparkiq.testing import TableWriter

TABLE = "failover"
TARGET_S = 2.0
KEYS = [key_name(i) for i in range(256)]


class _Writer(threading.Thread):
    def __init__(self, table: TableWriter) -> None:
        super().__init__(daemon=True)
        self.table, self.batch, self.stopped = table, 0, threading.Event()

    def write(self) -> None:
        b = self.batch
        self.table.write(as_arrow(KEYS, [b] * len(KEYS), [0.0] * len(KEYS)), batch_id=b)
        self.batch += 1

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            self.write()


def _serve(state_dir: str, node_id: str, port: int, peers: str) -> subprocess.Popen[bytes]:
    return _common.start_python(
        [
            sys.executable, "-m", "sparkiq.cli", "serve", "--state-dir", state_dir,
            "--node-id", node_id, "--listen", f"127.0.0.1:{port}", "--peers", peers,
            "--heartbeat-interval", "0.2", "--failure-timeout", "1.5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _settle(urls: list[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            nodes = {
                n["node_id"]: n for n in polling_client().get(f"{urls[0]}/metadata").json()["nodes"]
            }
            if len(nodes) == len(urls) and all(
                polling_client().get(f"{u}/readyz").status_code == 200 for u in urls
            ):
                return nodes
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError("the cluster did not settle")


def _query_loop(
    url: str, seed: int, stop: threading.Event, answers: list[tuple[float, int, bool, bool]]
) -> None:
    """Query random keys until ``stop``; record (time, partition, answered, consistent)."""
    rng = random.Random(seed)
    with Client(url) as client:
        while not stop.is_set():
            request = StateQueryRequest.in_store(TABLE).with_query(
                KeyQuery.with_key(rng.choice(KEYS))
            )
            now = time.monotonic()
            try:
                ((p, r),) = client.query(request).partition_results.items()
            except Exception:
                answers.append((now, -1, False, True))
                continue
            right = r.is_failure or r.result["n"] == r.position.to_map()[TABLE][p]
            answers.append((now, p, r.is_success, right))


def _all_answered(
    answers: list[tuple[float, int, bool, bool]], partitions: list[int], killed: float
) -> bool:
    """Whether every partition in ``partitions`` was answered after ``killed``."""
    served = {p for t, p, ok, _ in list(answers) if ok and t >= killed}
    return served >= set(partitions)


def run(scale: Scale = Scale.FULL) -> Report:
    rounds = scale.pick(5, 2, 1)
    # smoke: two nodes still fail over (the standby of every partition is the survivor)
    nodes_n = scale.pick(3, 3, 2)
    # Seconds of load before the kill; after it, the least and the most the load goes on.
    # Full runs keep 3 s of load after every kill; a smoke run stops once every partition
    # answered again (on a busy machine that may take longer than 3 s).
    before_s, after_least_s, after_most_s = scale.pick(
        (1.0, 3.0, 3.0), (1.0, 3.0, 3.0), (0.3, 0.3, 30.0)
    )
    report = Report(
        name="failover",
        title="Failover after kill -9 of an active node",
        measures=(
            "per partition the killed node was active for: time from SIGKILL to the first "
            "successful answer, with a client querying random keys continuously through "
            f"another node ({rounds} kills, {nodes_n} nodes, 8 partitions, 1 standby)"
        ),
        baseline="none: the figure is a duration",
        target=f"answered by standbys within {TARGET_S:.0f} s of the kill",
        columns=[
            "round",
            "partitions failed over",
            "median ms",
            "max ms",
            "failed answers",
            "wrong answers",
        ],
        scale=scale,
    )
    all_times: list[float] = []
    with scratch_dir("failover") as root:
        state_dir = os.path.join(root, "state")
        table = open_table(state_dir, TABLE, 8)
        writer = _Writer(table)
        writer.write()
        ports = [_free_port() for _ in range(nodes_n)]
        seed = f"127.0.0.1:{ports[0]}"
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        procs = [_serve(state_dir, f"n{i}", ports[i], seed if i else "") for i in range(nodes_n)]
        writer.start()
        try:
            for url in urls:
                _wait(url)
            for round_ in range(rounds):
                nodes = _settle(urls)
                candidates = sorted(
                    (n for n in nodes if n != "n0"), key=lambda n: -len(nodes[n]["active"][TABLE])
                )
                victim = int(candidates[0][1:])
                partitions = nodes[f"n{victim}"]["active"][TABLE]
                answers: list[tuple[float, int, bool, bool]] = []
                stop = threading.Event()

                loader = threading.Thread(
                    target=_query_loop, args=(urls[0], round_, stop, answers), daemon=True
                )
                loader.start()
                time.sleep(before_s)
                killed = time.monotonic()
                procs[victim].send_signal(signal.SIGKILL)
                procs[victim].wait()
                time.sleep(after_least_s)
                while time.monotonic() - killed < after_most_s and not _all_answered(
                    answers, partitions, killed
                ):
                    time.sleep(0.05)
                stop.set()
                loader.join()
                times = []
                for partition in partitions:
                    served = [t for t, p, ok, _ in answers if p == partition and ok and t >= killed]
                    if served:
                        times.append((served[0] - killed) * 1000)
                all_times += times
                failed = sum(1 for t, _, ok, _ in answers if not ok and t >= killed)
                wrong = sum(1 for *_, right in answers if not right)
                report.rows.append(
                    [
                        str(round_ + 1),
                        f"{len(times)} of {len(partitions)}",
                        f"{median(times):.0f}" if times else "-",
                        f"{max(times):.0f}" if times else "-",
                        str(failed),
                        str(wrong),
                    ]
                )
                if round_ + 1 < rounds:  # the next round kills a node of a whole cluster
                    procs[victim] = _serve(
                        state_dir, f"n{victim}", ports[victim], seed if victim else ""
                    )
                    _wait(urls[victim])
        finally:
            writer.stopped.set()
            writer.join()
            _stop(*procs)
    worst = max(all_times) / 1000 if all_times else float("inf")
    report.readings.append(
        f"failover over {len(all_times)} partition-kills: median {median(all_times):.0f} ms, "
        f"p90 {percentile(all_times, 90):.0f} ms, max {max(all_times):.0f} ms; "
        + verdict(worst, TARGET_S, "s", at_most=True)
    )
    report.figures["failover_ms"] = all_times
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
