"""``sparkiq serve --checkpoint``: two real serving processes answer on a running query's state.

The query (the user's code, untouched: ``groupBy(user).count()`` to a console-less memory
sink) keeps running; the nodes learn its checkpoint from ``SPARKIQ_CHECKPOINT``, split its
partitions between them (one standby each), and answer key lookups (routed to whichever
node hosts the key's partition) and SQL through :class:`sparkiq.Client`, at the query's own
batch ids, compared with Spark's State Data Source.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Client
from sparkiq.cli import main
from sparkiq.testing import JsonSource
from tests.cluster.serve_processes import make_nodes, start_nodes

pytestmark = pytest.mark.slow

PARTITIONS = 4


@pytest.fixture(scope="module")
def query(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("serve-ckpt")
    source = JsonSource(root / "input", "user string, clicks long")
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    try:
        running = (
            source.stream(spark)
            .groupBy("user")
            .count()
            .writeStream.format("memory")
            .queryName("serve_clicks")
            .outputMode("update")
            .option("checkpointLocation", str(root / "checkpoint"))
            .start()
        )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    running.source, running.root = source, root
    try:
        yield running
    finally:
        running.stop()


def feed(query: Any, rows: list[dict[str, Any]]) -> int:
    query.source.write(rows)
    query.processAllAvailable()
    return int(query.lastProgress["batchId"])


def state_counts(spark: Any, checkpoint: Path, batch: int) -> dict[str, int]:
    frame = spark.read.format("statestore").option("batchId", batch).load(str(checkpoint))
    return {r["key"]["user"]: r["value"]["count"] for r in frame.collect()}


def wait_batch(client: Client, batch: int, timeout: float = 120.0) -> None:
    """Until the cluster answers SQL at ``batch`` (its position's batch for the table)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = client.sql("SELECT count(*) AS n FROM clicks_agg")
            if max(result.position.partition_offsets("clicks_agg").values()) >= batch:
                return
        except Exception:  # not hosted yet, or a node still restoring
            pass
        time.sleep(0.1)
    raise AssertionError(f"the cluster did not reach batch {batch}")


def test_two_serve_nodes_answer_on_a_running_querys_state(
    spark: Any, query: Any, tmp_path: Path
) -> None:
    checkpoint = query.root / "checkpoint"
    first = feed(query, [{"user": f"u{i}", "clicks": 1} for i in range(30)])
    nodes = make_nodes(str(tmp_path / "state"), str(tmp_path), 2)
    for node in nodes:
        node.env = {"SPARKIQ_CHECKPOINT": f"clicks={checkpoint}"}
    start_nodes(nodes)
    try:
        clients = [Client(n.url) for n in nodes]
        wait_batch(clients[0], first)
        expected = state_counts(spark, checkpoint, first)
        for client in clients:
            rows = client.sql("SELECT user, count FROM clicks_agg").rows
            assert {r["user"]: r["count"] for r in rows} == expected
        # keys of every partition, asked of either node: routed to the node hosting them
        for user in ("u0", "u7", "u13", "u29"):
            for client in clients:
                assert client.get("clicks_agg", user) == {"user": user, "count": 1}
        # the query goes on; the nodes follow its new batch
        second = feed(query, [{"user": "u7", "clicks": 1}, {"user": "new", "clicks": 1}])
        wait_batch(clients[1], second)
        assert clients[1].get("clicks_agg", "u7") == {"user": "u7", "count": 2}
        assert clients[0].get("clicks_agg", "new") == {"user": "new", "count": 1}
        owners = {clients[0].metadata_for_key("clicks_agg", u).partition for u in expected}
        assert owners == set(range(PARTITIONS))  # Spark's placement: every partition is used
    finally:
        for node in nodes:
            node.stop()


def test_serve_refuses_a_malformed_checkpoint_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--checkpoint", "no-equals-sign"]) == 2
    assert "expected NAME=URI" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", "a=/x", "--checkpoint", "a=/y"]) == 2
    assert "given twice" in capsys.readouterr().err
