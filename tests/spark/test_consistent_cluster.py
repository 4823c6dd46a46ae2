"""Reads that span partitions see one batch through a 3-node ``sparkiq serve`` cluster, while
Spark commits batches and the busiest node is killed with SIGKILL.

The invariant is the one of ``test_consistent_reads``: stock moves between bins, every move
is two legs (-qty, +qty) in one input file (one micro-batch), so after batch ``B`` the units
of all bins sum to 0 and the legs to ``2 * MOVES * (B + 1)``. A Spark writer (no local node)
commits the batches; three serve processes replicate them. Readers, each with its own
:class:`~sparkiq.Client` on a different node, loop over SQL aggregates (``POST /query``),
typed all-partition ``RangeQuery`` and a self-join. Midway, the node active for most
partitions is killed with ``kill -9``, and later restarted on its own local files (its
history then starts at the batch it reopens at, so reads pinned to older batches must be
served by the other replicas).

Every answer must either satisfy the invariant at the batch its position names, or be a
clean failure (a :class:`~sparkiq.errors.SparkiqError` or a failed partition naming the
problem). Once the survivors have dropped the killed node, no read may fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkiq import App, Client, RangeQuery, StateQueryRequest
from sparkiq.errors import SparkiqError
from sparkiq.testing import JsonSource
from tests import http_calls
from tests.cluster.serve_processes import make_nodes, wait_cluster
from tests.spark.test_consistent_reads import MOVES, PAUSE_S, batch_of, moves

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow

PARTITIONS = 8
#: How long a serve process may take to start listening. It is a deadline for a condition,
#: not a speed check: on a machine running several test suites at once (load average 30-40
#: on 2 cores) interpreter start-up and imports alone took over 30 s.
STARTUP = 180.0


class Broken(AssertionError):
    """An answer that breaks the invariant (never a clean failure)."""


def check(units: int, legs: int, batch_id: int) -> None:
    if units != 0:
        raise Broken(f"units sum to {units} at batch {batch_id}, never a state of the table")
    if legs != 2 * MOVES * (batch_id + 1):
        raise Broken(f"{legs} legs at batch {batch_id}, expected {2 * MOVES * (batch_id + 1)}")


def read_sql(client: Client) -> int:
    result = client.sql("SELECT sum(units) AS units, sum(legs) AS legs FROM bins")
    batch_id = batch_of(result.position)
    check(result.rows[0]["units"], result.rows[0]["legs"], batch_id)
    return batch_id


def read_self_join(client: Client) -> int:
    result = client.sql(
        "SELECT sum(a.units) AS units, sum(b.legs) AS legs FROM bins a JOIN bins b ON a.bin = b.bin"
    )
    batch_id = batch_of(result.position)
    check(result.rows[0]["units"], result.rows[0]["legs"], batch_id)
    return batch_id


class PartitionFailed(SparkiqError):
    """A typed read where a partition answered with a failure (a clean failure)."""


def read_range(client: Client) -> int:
    result = client.query(
        StateQueryRequest.in_store("bins").with_query(RangeQuery.with_no_bounds())
    )
    units = legs = 0
    failed = {p: a for p, a in result.partition_results.items() if a.is_failure}
    for answer in result.partition_results.values():
        if answer.is_failure:
            continue
        with answer.result as rows:
            for _, row in rows:
                units += row["units"]
                legs += row["legs"]
    if failed:
        partition, answer = next(iter(failed.items()))
        raise PartitionFailed(
            f"partition {partition}: {answer.failure_reason}: {answer.failure_message}"
        )
    assert len(result.partition_results) == PARTITIONS, result.partition_results
    batch_id = batch_of(result.position)
    check(units, legs, batch_id)
    return batch_id


READERS: dict[str, Callable[[Client], int]] = {
    "sql": read_sql,
    "self-join": read_self_join,
    "range": read_range,
}


@dataclass
class Answer:
    reader: str
    sent: float
    batch: int = -1
    failure: str = ""  # a clean failure
    broken: str = ""  # the invariant broken, or an error that is not a clean failure


class Reader(threading.Thread):
    """Loops ``READERS[kind]`` through a Client on ``url`` until stopped, :data:`PAUSE_S`
    apart; records every answer."""

    def __init__(self, kind: str, url: str) -> None:
        super().__init__(daemon=True, name=f"reader-{kind}")
        self.kind, self.url = kind, url
        self.answers: list[Answer] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        read = READERS[self.kind]
        with Client(self.url, timeout=20.0) as client:
            while not self.stop_event.is_set():
                answer = Answer(self.kind, time.monotonic())
                try:
                    answer.batch = read(client)
                except Broken as exc:
                    answer.broken = str(exc)
                except SparkiqError as exc:
                    answer.failure = f"{type(exc).__name__}: {exc}"
                except BaseException as exc:  # not a clean failure: reported as broken
                    answer.broken = f"{type(exc).__name__}: {exc}"
                self.answers.append(answer)
                self.stop_event.wait(PAUSE_S)

    def answered_since(self, since: float) -> int:
        return sum(1 for a in self.answers if a.sent >= since and not a.failure)


def metadata(url: str) -> dict[str, Any]:
    nodes = http_calls.get(f"{url}/metadata", timeout=5).json()["nodes"]
    return {n["node_id"]: n for n in nodes}


def wait_for(check: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def survivors_dropped(urls: list[str], victim: str) -> bool:
    try:
        return all(victim not in metadata(u) for u in urls)
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def test_invariant_through_a_serve_cluster_with_kill_minus_nine(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", "bin string, qty long")
    seeds = iter(range(100))
    source.write(moves(next(seeds)))
    app = App(spark, state_dir=str(tmp_path / "state"))
    app.materialize(
        "bins",
        source.stream(spark)
        .groupBy("bin")
        .agg(F.sum("qty").alias("units"), F.count("*").alias("legs")),
        key="bin",
        partitions=PARTITIONS,
    )
    app.start(local_node=False)
    nodes = make_nodes(str(tmp_path / "state"), str(tmp_path), 3)
    readers: list[Reader] = []

    def commit_one() -> None:
        source.write(moves(next(seeds)))
        app.process_all_available()

    try:
        for node in nodes:  # they start while Spark runs the first batch
            node.start()
        app.process_all_available()
        for node in nodes:
            node.wait_up(timeout=STARTUP)
        wait_cluster([n.url for n in nodes], 3, timeout=STARTUP)
        active = {n: len(doc["active"]["bins"]) for n, doc in metadata(nodes[0].url).items()}
        victim = next(n for n in nodes if n.node_id == max(active, key=lambda m: active[m]))
        others = [n for n in nodes if n is not victim]
        # every reader on a node that survives, the two SQL readers on different nodes
        entry = {"sql": others[0], "self-join": others[1], "range": others[0]}
        readers = [Reader(kind, entry[kind].url) for kind in READERS]
        started = time.monotonic()
        for reader in readers:
            reader.start()
        for _ in range(2):
            commit_one()
        wait_for(
            lambda: all(r.answered_since(started) >= 3 for r in readers),
            60,
            "the readers answered too little before the kill",
        )
        killed_at = time.monotonic()
        victim.kill()
        commit_one()  # Spark keeps committing while the cluster fails over
        wait_for(
            lambda: survivors_dropped([n.url for n in others], victim.node_id),
            30,
            f"the survivors did not drop {victim.node_id}",
        )
        failed_over = time.monotonic()
        commit_one()
        wait_for(
            lambda: all(r.answered_since(failed_over) >= 3 for r in readers),
            60,
            "the readers answered too little after the failover",
        )
        victim.start()  # same id, port and local files: its history starts where it reopens
        victim.wait_up(timeout=STARTUP)
        wait_cluster([n.url for n in nodes], 3, timeout=STARTUP)
        rejoined = time.monotonic()
        commit_one()
        wait_for(
            lambda: all(r.answered_since(rejoined) >= 3 for r in readers),
            60,
            "the readers answered too little after the restart",
        )
        last_batch = max(a.batch for r in readers for a in r.answers)
    finally:
        for reader in readers:
            reader.stop_event.set()
        for reader in readers:
            reader.join(timeout=60)
        app.stop()
        for node in nodes:
            node.stop()

    answers = sorted((a for r in readers for a in r.answers), key=lambda a: a.sent)
    broken = [a for a in answers if a.broken]
    assert broken == [], (
        f"{len(broken)} of {len(answers)} answers broke the invariant: {broken[:5]}"
    )
    failures = [a for a in answers if a.failure]
    for reader in readers:
        batches = [a.batch for a in reader.answers if not a.failure]
        # the readers ran while batches landed, not only before or after
        assert len(set(batches)) >= 3, (reader.kind, batches)
    after = [a for a in failures if a.sent >= failed_over]
    assert after == [], f"{len(after)} reads failed after the failover: {after[:5]}"
    print(
        f"{len(answers)} answers up to batch {last_batch}, "
        f"{len(failures)} clean failures (all between the kill and the failover, "
        f"{failed_over - killed_at:.2f} s): {[a.failure[:160] for a in failures[:3]]}"
    )
