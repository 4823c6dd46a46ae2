"""Reads pinned to one batch when replicas fail: a lagging partition, a replica restarted
mid-history, and retention moving past a version a read still holds.

Every answer is checked against the table's state after exactly the batches its position
names, computed in plain Python from the batches written (:func:`expected_rows`).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pyarrow.compute as pc

from sparkiq import (
    Client,
    FailureReason,
    Node,
    Position,
    PositionBound,
    RangeQuery,
    StateQueryRequest,
)
from sparkiq.changelog import Changelog, TableManifest
from sparkiq.schema.types import TableSchema
from sparkiq.sql.errors import SqlPartitionError
from sparkiq.stores.dispatch import CATCH_UP_WAIT
from sparkiq.stores.history import History
from sparkiq.stores.versions import VALID_FROM, VALID_TO
from tests.changelog.helpers import SCHEMA_JSON, expected_rows, make_table, write_batch
from tests.cluster.cluster_helpers import FAST, settle, start_http_cluster, wait_until

KEYS = [f"k{i:03d}" for i in range(40)]
PARTITIONS = 4


def batches(count: int, seed: int = 3) -> list[dict[str, int | None]]:
    """``count`` batches: each rewrites most keys (n = batch * 1000 + i) and deletes a few."""
    rng = random.Random(seed)
    out: list[dict[str, int | None]] = []
    for batch_id in range(count):
        changes: dict[str, int | None] = {}
        for i, key in enumerate(KEYS):
            roll = rng.random()
            if batch_id == 0 or roll < 0.8:
                changes[key] = batch_id * 1000 + i
            elif roll < 0.9:
                changes[key] = None
        out.append(changes)
    return out


HISTORY = batches(24)


def truth(batch_id: int) -> dict[str, int]:
    return {k: row["n"] for k, row in expected_rows(HISTORY[: batch_id + 1]).items()}


def read_all(node: Node, request: StateQueryRequest) -> tuple[dict[str, int], set[int]]:
    """Every row of a successful all-partition read, and the batches its partitions named."""
    result = node.query(request)
    rows: dict[str, int] = {}
    for partition, answer in result.partition_results.items():
        assert answer.is_success, (partition, answer)
        rows.update((k, row["n"]) for k, row in answer.result)
    return rows, set(result.position.to_map()["t"].values())


def all_rows() -> StateQueryRequest:
    return StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())


def write(changelog: Changelog, upto: int, start: int = 0) -> None:
    for batch_id in range(start, upto + 1):
        write_batch(changelog, batch_id, HISTORY[batch_id])


def wait_applied(node: Node, batch_id: int) -> None:
    assert node.wait_for("t", batch_id, timeout=30), f"{node.node_id} did not apply {batch_id}"


# -- a lagging replica ---------------------------------------------------------------------------


def test_a_lagging_partition_is_waited_for_then_named(tmp_path: Path) -> None:
    lagging = 2
    changelog = make_table(str(tmp_path), partitions=PARTITIONS)
    write(changelog, 2)
    with Node(str(tmp_path), poll_interval=0.01) as node:
        wait_applied(node, 2)
        # Batch 3 is committed, but the lagging partition's segment is not readable yet
        # (a slow upload): that partition stays at batch 2, the others move to 3.
        record = write_batch(changelog, 3, HISTORY[3], commit=False)
        segment = Path(changelog.segment_path(lagging, 3))
        held_back = segment.read_bytes()
        segment.unlink()
        changelog.write_commit(record)
        node.notify("t")
        replicas = node.replica("t").partitions
        wait_until(
            lambda: (
                all(r.batch_id == 3 for p, r in replicas.items() if p != lagging)
                and replicas[lagging].error is not None
            ),
            30,
            "the other partitions did not apply batch 3",
        )

        # An unpinned read is served at the newest batch every partition has: 2.
        rows, served_at = read_all(node, all_rows())
        assert (rows, served_at) == (truth(2), {2})

        # A read at batch 3 waits for the lagging partition, then names it.
        started = time.monotonic()
        result = node.query(all_rows().as_of(3))
        waited = time.monotonic() - started
        answer = result.partition_results[lagging]
        assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND, answer
        assert f"partition {lagging} of 't'" in (answer.failure_message or "")
        assert "behind batch 3" in (answer.failure_message or "")
        assert waited >= CATCH_UP_WAIT, waited
        for partition, other in result.partition_results.items():
            if partition != lagging:
                assert other.is_success and other.position.to_map()["t"] == {partition: 3}
        # So does a bound at batch 3, through SQL: the statement fails naming the partition.
        bound = PositionBound.at(Position.from_map({"t": {0: 3}}))
        try:
            node.sql("SELECT count(*) AS n FROM t", bound=bound)
        except SqlPartitionError as exc:
            assert exc.partition == lagging, exc
            assert "NOT_UP_TO_BOUND" in str(exc), exc
        else:
            raise AssertionError("a statement bound to batch 3 answered without partition 2")

        # A read issued while it lags is answered once it catches up within the wait.
        answered: list[tuple[dict[str, int], set[int]]] = []
        reader = threading.Thread(
            target=lambda: answered.append(read_all(node, all_rows().as_of(3)))
        )
        reader.start()
        reader.join(timeout=CATCH_UP_WAIT / 4)
        assert reader.is_alive(), "the read did not wait for the lagging partition"
        segment.write_bytes(held_back)  # the upload lands
        node.notify("t")
        reader.join(timeout=30)
        assert answered == [(truth(3), {3})]
        rows, served_at = read_all(node, all_rows())
        assert (rows, served_at) == (truth(3), {3})


def test_a_partition_lagging_on_every_replica_fails_the_routed_read_naming_it(
    tmp_path: Path,
) -> None:
    lagging = 1
    changelog = make_table(str(tmp_path), partitions=PARTITIONS)
    write(changelog, 2)
    nodes = start_http_cluster(str(tmp_path), 2, standbys=1)
    try:
        for node in nodes:
            wait_applied(node, 2)
        record = write_batch(changelog, 3, HISTORY[3], commit=False)
        segment = Path(changelog.segment_path(lagging, 3))
        held_back = segment.read_bytes()
        segment.unlink()
        changelog.write_commit(record)
        for node in nodes:
            node.notify("t")
            partitions = node.replica("t").partitions
            wait_until(
                lambda partitions=partitions: all(  # type: ignore[misc]
                    r.batch_id == 3 for p, r in partitions.items() if p != lagging
                ),
                30,
                f"{node.node_id} did not apply batch 3",
            )
        # and each has heard from the other that the partition is stuck
        for node, other in ((nodes[0], "n1"), (nodes[1], "n0")):
            membership = node.coordinator.membership  # type: ignore[union-attr]
            wait_until(
                lambda m=membership, o=other: (  # type: ignore[misc]
                    m.hosted_state(o).get("t", {}).get(lagging, (0, ""))[1] == "error"
                ),
                30,
                f"{node.node_id} did not hear that partition {lagging} is stuck",
            )
        # Unpinned: the newest batch the partitions can serve, as far as the node knows.
        rows, served_at = read_all(nodes[0], all_rows())
        assert (rows, served_at) in ((truth(2), {2}), (truth(3), {3}))
        started = time.monotonic()
        result = nodes[0].query(all_rows().as_of(3))
        waited = time.monotonic() - started
        answer = result.partition_results[lagging]
        assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND, answer
        assert f"partition {lagging} of 't'" in (answer.failure_message or ""), answer
        assert waited >= CATCH_UP_WAIT, waited
        print(f"a read of a partition lagging on both replicas failed after {waited:.2f} s")
        segment.write_bytes(held_back)
        for node in nodes:
            node.notify("t")
            partitions = node.replica("t").partitions
            wait_until(  # wait_applied returns at once while a partition is in error
                lambda partitions=partitions: all(  # type: ignore[misc]
                    r.batch_id == 3 for r in partitions.values()
                ),
                30,
                f"{node.node_id} did not catch up once the segment landed",
            )
        assert read_all(nodes[1], all_rows().as_of(3)) == (truth(3), {3})
    finally:
        for node in nodes:
            node.stop()


# -- a replica restarted mid-history -------------------------------------------------------------


def test_a_restarted_replica_serves_history_from_where_it_reopened(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=PARTITIONS)
    write(changelog, 5)
    with Node(str(tmp_path), poll_interval=0.01) as node:
        wait_applied(node, 5)
        for batch_id in (2, 4, 5):
            assert read_all(node, all_rows().as_of(batch_id)) == (truth(batch_id), {batch_id})
    with Node(str(tmp_path), poll_interval=0.01) as node:  # the same local files
        wait_applied(node, 5)
        write(changelog, 7, start=6)
        node.notify("t")
        wait_applied(node, 7)
        for batch_id in (5, 6, 7):
            assert read_all(node, all_rows().as_of(batch_id)) == (truth(batch_id), {batch_id})
        result = node.query(all_rows().as_of(3))
        for answer in result.partition_results.values():
            assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND, answer
            assert "the oldest batch still readable is 5" in (answer.failure_message or ""), answer


def test_a_router_asks_the_replica_that_still_has_the_batch(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=PARTITIONS)
    write(changelog, 5)
    nodes = start_http_cluster(str(tmp_path), 2, standbys=1)
    try:
        for node in nodes:
            wait_applied(node, 5)
        nodes[1].stop()
        nodes[1] = Node(
            str(tmp_path), node_id="n1", listen="127.0.0.1:0", peers=[nodes[0].url], **FAST
        ).start()
        settle(nodes)
        wait_applied(nodes[1], 5)
        restarted, kept = nodes[1], nodes[0]
        # The restarted node keeps batches from 5 on, the other one from 0.
        refused = restarted.query_local(all_rows().as_of(3))
        for answer in refused.partition_results.values():
            assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND, answer
            assert "the oldest batch still readable is 5" in (answer.failure_message or ""), answer
        for batch_id in (1, 3):  # asked of the restarted node, served by the other
            assert read_all(restarted, all_rows().as_of(batch_id)) == (truth(batch_id), {batch_id})
        # Newer batches are served by either.
        write(changelog, 6, start=6)
        for node in nodes:
            node.notify("t")
            wait_applied(node, 6)
        assert read_all(restarted, all_rows()) == (truth(6), {6})
        assert read_all(kept, all_rows().as_of(5)) == (truth(5), {5})
        # Through a Client that has seen batch 6: AS OF asks for the past on purpose, so its
        # monotonic bound does not apply; the node pins the whole request to batch 3.
        with Client(restarted.url) as client:
            newest = client.query(all_rows())
            assert set(newest.position.to_map()["t"].values()) == {6}
            past = client.query(all_rows().as_of(3))
            rows: dict[str, int] = {}
            for answer in past.partition_results.values():
                assert answer.is_success, answer
                rows.update((k, row["n"]) for k, row in answer.result)
            assert (rows, set(past.position.to_map()["t"].values())) == (truth(3), {3})
    finally:
        for node in nodes:
            node.stop()


# -- retention moving past a version a read holds ------------------------------------------------


def make_short_history_table(state_dir: str, batches_kept: int) -> Changelog:
    schema = TableSchema.from_spark_json(SCHEMA_JSON, ["k"])
    manifest = TableManifest(
        name="t", schema=schema, partitions=PARTITIONS, history=History(batches=batches_kept)
    )
    changelog = Changelog(state_dir, "t")
    manifest.ensure_written(changelog.storage, changelog.manifest_path)
    return changelog


def test_a_read_holding_a_version_keeps_its_batch_while_history_moves_on(tmp_path: Path) -> None:
    changelog = make_short_history_table(str(tmp_path), batches_kept=2)
    write(changelog, 3)
    with Node(str(tmp_path), poll_interval=0.01) as node:
        wait_applied(node, 3)
        held_range = node.query(all_rows().as_of(3))  # not consumed yet
        held_columns = node._lookup.local_rows(  # what the SQL engine holds
            "t", 3, PositionBound.unbounded()
        )
        assert held_columns is not None and held_columns.batch_id == 3
        partition = node.replica("t").partitions[0].store
        held_version = partition.version(3)
        # Twenty more batches rewrite most keys: the history window moves far past 3 and the
        # partitions' chunks are merged (the rows only batch 3 saw are dropped from them).
        write(changelog, 23, start=4)
        node.notify("t")
        wait_applied(node, 23)
        assert partition.versions is not None and partition.versions.oldest == 21
        refused = node.query(all_rows().as_of(3))
        for answer in refused.partition_results.values():
            assert answer.failure_reason is FailureReason.NOT_UP_TO_BOUND, answer
            assert "the oldest batch still readable is 21" in (answer.failure_message or "")

        # The reads that held batch 3 still return exactly its rows.
        rows: dict[str, int] = {}
        for answer in held_range.partition_results.values():
            assert answer.is_success, answer
            rows.update((k, row["n"]) for k, row in answer.result)
        assert rows == truth(3)
        raw = held_columns.raw
        visible = raw.filter(
            pc.and_(pc.less_equal(raw.column(VALID_FROM), 3), pc.greater(raw.column(VALID_TO), 3))
        )
        columns = dict(
            zip(visible.column("k").to_pylist(), visible.column("n").to_pylist(), strict=True)
        )
        assert columns == truth(3)
        in_partition = {k: n for k, n in truth(3).items() if node.partition_for_key("t", k) == 0}
        table = held_version.table(["k", "n"])
        assert dict(
            zip(table.column("k").to_pylist(), table.column("n").to_pylist(), strict=True)
        ) == (in_partition)
        # and the node answers the newest batch as usual
        assert read_all(node, all_rows()) == (truth(23), {23})
