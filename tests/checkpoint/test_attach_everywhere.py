"""Attached tables get everything else for free (issue 13, item 4): the same streaming
aggregation, untouched, served by two ``sparkiq serve --checkpoint`` processes and seen
through every surface a materialized table has.

One Spark query (``groupBy(user).agg(count, sum)`` over a JSON folder, to a memory sink,
with its own checkpoint) runs for the whole module, and one two-node cluster (one standby
per partition; ``n0`` also speaks the Postgres wire protocol) serves its checkpoint. Each
test feeds the query what it needs and checks one surface against Spark's own State Data
Source (``format("statestore")``) at the query's batch: ``sparkiq status``, the JSON the
web console reads, psql and psycopg, a push query over HTTP, and routing through a
``kill -9``. The last test runs ``App.attach`` under Spark Connect.

Tests leave the cluster usable for the next (a killed node is restarted by the next test
that needs it), so they hold in any order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import sparkiq
from sparkiq import Client
from sparkiq.cli import main
from sparkiq.errors import ConfigError
from sparkiq.testing import JsonSource
from tests import http_calls
from tests.cluster.serve_processes import ServeProcess, free_port, make_nodes, wait_cluster

pytestmark = pytest.mark.slow

PARTITIONS = 4
TABLE = "clicks_agg"


class Pipeline:
    """The user's query, fed one JSON file (one micro-batch) per :meth:`feed`."""

    def __init__(self, spark: Any, root: Path) -> None:
        from pyspark.sql import functions as F

        self.spark = spark
        self.checkpoint = root / "checkpoint"
        self.source = JsonSource(root / "input", "user string, clicks long")
        previous = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
        try:
            self.query = (
                self.source.stream(spark)
                .groupBy("user")
                .agg(F.count("*").alias("n"), F.sum("clicks").alias("total"))
                .writeStream.format("memory")
                .queryName("everywhere_clicks")
                .outputMode("update")
                .option("checkpointLocation", str(self.checkpoint))
                .start()
            )
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", previous)
        self.batch = -1

    def feed(self, rows: list[dict[str, Any]]) -> int:
        self.source.write(rows)
        self.query.processAllAvailable()
        self.batch = int(self.query.lastProgress["batchId"])
        return self.batch

    def state(self, batch: int | None = None) -> dict[str, dict[str, Any]]:
        """Spark's State Data Source at ``batch`` (default: the newest) as served rows:
        ``{user: {"user", "count", "sum"}}`` (the buffer of ``count(*)`` and ``sum``)."""
        at = self.batch if batch is None else batch
        frame = self.spark.read.format("statestore").option("batchId", at)
        out = {}
        for row in frame.load(str(self.checkpoint)).collect():
            user = row["key"]["user"]
            out[user] = {"user": user, "count": row["value"]["count"], "sum": row["value"]["sum"]}
        return out


@pytest.fixture(scope="module")
def pipeline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    running = Pipeline(spark, tmp_path_factory.mktemp("everywhere"))
    running.feed([{"user": f"u{i}", "clicks": i} for i in range(24)])
    try:
        yield running
    finally:
        running.query.stop()


def alive(node: ServeProcess) -> bool:
    return node.process is not None and node.process.poll() is None


class Cluster:
    """Two ``sparkiq serve --checkpoint clicks=<checkpoint>`` nodes, ``n0`` also on the
    Postgres wire protocol; :meth:`up` restarts a node a test killed."""

    def __init__(self, nodes: list[ServeProcess], state_dir: Path, pg_port: int) -> None:
        self.nodes, self.state_dir, self.pg_port = nodes, state_dir, pg_port
        self.clients = [Client(n.url) for n in nodes]

    def up(self) -> None:
        for node in self.nodes:
            if not alive(node):
                node.start()
                node.wait_up()
        wait_cluster([n.url for n in self.nodes], len(self.nodes))

    def wait_batch(self, batch: int, timeout: float = 120.0) -> None:
        """Until every replica of every live node (active and standby, per ``/stats``) is
        live at ``batch`` or later and each node's SQL answers at it, so what a test reads
        next is pinned to ``batch``. A deadline for a hang (serve processes restore on a
        loaded machine), not a speed target."""
        deadline = time.monotonic() + timeout
        pending = [(n, c) for n, c in zip(self.nodes, self.clients, strict=True) if alive(n)]
        while pending and time.monotonic() < deadline:
            node, client = pending[0]
            try:
                stats = http_calls.get(f"{node.url}/stats", timeout=5).json()["partitions"]
                replicas = [s for s in stats if s["store"] == TABLE]
                caught_up = bool(replicas) and all(
                    s["state"] == "live" and s["batch_id"] >= batch for s in replicas
                )
                result = client.sql(f"SELECT count(*) AS n FROM {TABLE}")
                offsets = result.position.partition_offsets(TABLE)
                if caught_up and len(offsets) == PARTITIONS and min(offsets.values()) >= batch:
                    pending.pop(0)
                    continue
            except Exception:  # not hosted yet, or a node still restoring
                pass
            time.sleep(0.1)
        assert not pending, f"{[n.node_id for n, _ in pending]} did not reach batch {batch}"


@pytest.fixture(scope="module")
def cluster(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("everywhere-serve")
    nodes = make_nodes(str(root / "state"), str(root), 2)
    pg_port = free_port()
    nodes[0].extra = ["--pg-listen", f"127.0.0.1:{pg_port}"]
    for node in nodes:
        node.env = {"SPARKIQ_CHECKPOINT": f"clicks={pipeline.checkpoint}"}
    running = Cluster(nodes, root / "state", pg_port)
    try:
        running.up()
        running.wait_batch(pipeline.batch)
        yield running
    finally:
        for node in nodes:
            node.stop()


def get_json(url: str) -> Any:
    response = http_calls.get(url, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def post_sql(url: str, sql: str) -> httpx.Response:
    # a hang bound, not httpx's implicit 5 s: a loaded machine runs the statement slower
    return http_calls.post(f"{url}/query", json={"sql": sql}, timeout=30)


def test_console_views_show_attached_tables(pipeline: Pipeline, cluster: Cluster) -> None:
    """What the console's table and cluster views read (``/stores``, ``/metadata``,
    ``/stats``, ``/readyz``, its SQL and key lookups) on each node: the attached table,
    its partitions split between the nodes with a standby each, at Spark's batch."""
    cluster.up()
    batch = pipeline.feed([{"user": "u3", "clicks": 5}, {"user": "console", "clicks": 2}])
    cluster.wait_batch(batch)
    expected = pipeline.state(batch)
    for node in cluster.nodes:
        # what a node knows of its peer's replicas comes with heartbeats: wait for it
        deadline = time.monotonic() + 60
        while True:
            members = get_json(f"{node.url}/metadata")["nodes"]
            hosted = [s["batch_id"] for m in members for s in m["hosted"].get(TABLE, {}).values()]
            if len(members) == 2 and len(hosted) == 2 * PARTITIONS and min(hosted) >= batch:
                break
            assert time.monotonic() < deadline, members
            time.sleep(0.1)
        (store,) = get_json(f"{node.url}/stores")["stores"]
        assert (store["name"], store["key_columns"], store["partitions"]) == (
            TABLE, ["user"], PARTITIONS
        )  # fmt: skip
        assert store["window_column"] is None
        assert "count" in store["schema"] and "sum" in store["schema"]
        assert get_json(f"{node.url}/readyz")["ready"] is True
        assert sorted(m["node_id"] for m in members) == ["n0", "n1"]
        for p in range(PARTITIONS):
            active = [m["node_id"] for m in members if p in m["active"].get(TABLE, [])]
            standby = [m["node_id"] for m in members if p in m["standby"].get(TABLE, [])]
            assert len(active) == 1 and len(standby) == 1 and active != standby, (p, members)
        # both nodes are active for some partitions: the reads below are routed
        assert all(m["active"].get(TABLE) for m in members)
        stats = get_json(f"{node.url}/stats")
        mine = [s for s in stats["partitions"] if s["store"] == TABLE]
        assert {s["partition"] for s in mine} == set(range(PARTITIONS))  # active + standby
        assert all(s["state"] == "live" and s["batch_id"] >= batch for s in mine)
        # the table view's count and sample, and its key lookup, through the REST API
        count = post_sql(node.url, f"SELECT count(*) AS n FROM {TABLE}")
        assert count.status_code == 200 and count.json()["rows"] == [{"n": len(expected)}]
        sample = post_sql(node.url, f"SELECT * FROM {TABLE} LIMIT 20")
        assert sample.status_code == 200, sample.text
        assert sample.json()["columns"] == ["user", "count", "sum"]
        for row in sample.json()["rows"]:
            assert row == expected[row["user"]]
        for user in ("u3", "console", "u17"):
            doc = get_json(f"{node.url}/stores/{TABLE}/keys/{user}")
            assert doc["row"] == expected[user]
        missing = http_calls.get(f"{node.url}/stores/{TABLE}/keys/nobody", timeout=30)
        assert missing.status_code == 404, missing.text


def test_status_lists_attached_tables_with_positions(
    pipeline: Pipeline, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.up()
    batch = pipeline.feed([{"user": "status", "clicks": 1}])
    cluster.wait_batch(batch)
    checkpoint = f"clicks={pipeline.checkpoint}"
    deadline = time.monotonic() + 60  # status.json is rewritten as replicas make progress
    while True:
        code = main(["status", "--state-dir", str(cluster.state_dir), "--checkpoint", checkpoint])
        out = capsys.readouterr()
        assert code == 0, out.err
        rows = [line.split() for line in out.out.splitlines()]
        mine = [r for r in rows if r[:1] == [TABLE]]
        # one line for the table itself, then one per partition each node holds
        node_rows = [r for r in mine if len(r) >= 4 and r[1].isdigit() and r[2] == "live"]
        if len(node_rows) == 2 * PARTITIONS and all(int(r[3]) >= batch for r in node_rows):
            break
        assert time.monotonic() < deadline, out.out
        time.sleep(0.2)
    table_line = mine[0]
    assert table_line[1:3] == [str(PARTITIONS), "user"], out.out
    assert table_line[-2] == str(batch), out.out  # the newest committed batch
    assert f"checkpoint {pipeline.checkpoint}" in out.out
    assert "node 'n0'" in out.out and "node 'n1'" in out.out
    # a checkpoint that is none: a clear error, not an empty listing
    code = main(["status", "--state-dir", str(cluster.state_dir), "--checkpoint", "x=/nowhere"])
    assert code == 2 and "/nowhere" in capsys.readouterr().err


def _psql(port: int, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *("psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", "spark", "-d", "sparkiq"),
            *("-A", "-t", "-F", "|", "-c", command),
        ],
        env=dict(os.environ, PGCONNECT_TIMEOUT="10"),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (postgresql-client) not installed")
def test_psql_and_psycopg_answer_like_sparks_state(pipeline: Pipeline, cluster: Cluster) -> None:
    cluster.up()
    batch = pipeline.feed([{"user": "pg", "clicks": 9}, {"user": "u5", "clicks": 1}])
    cluster.wait_batch(batch)
    expected = pipeline.state(batch)
    done = _psql(cluster.pg_port, f'SELECT "user", count, sum FROM {TABLE} ORDER BY "user"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{u}|{r['count']}|{r['sum']}" for u, r in sorted(expected.items())
    ]
    done = _psql(cluster.pg_port, "\\dt")
    assert done.returncode == 0, done.stderr
    assert f"public|{TABLE}|table|sparkiq" in done.stdout.splitlines()
    dsn = f"host=127.0.0.1 port={cluster.pg_port} user=spark dbname=sparkiq connect_timeout=10"
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT "user", count, sum FROM {TABLE} WHERE count >= %s', [1])
        assert {r[0]: {"user": r[0], "count": r[1], "sum": r[2]} for r in rows} == expected
        one = conn.execute(f'SELECT sum FROM {TABLE} WHERE "user" = %s', ["u5"]).fetchall()
        assert one == [(expected["u5"]["sum"],)]


def test_push_query_sees_sparks_next_batch(pipeline: Pipeline, cluster: Cluster) -> None:
    """``EMIT CHANGES`` over HTTP on each node: the keys Spark's next batch changed, with
    their state after it (Spark's own state changes, read from its change files)."""
    cluster.up()
    users = [f"push-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    wanted = ", ".join(f"'{u}'" for u in users)
    statement = f"SELECT user, count, sum FROM {TABLE} WHERE user IN ({wanted}) EMIT CHANGES"
    streams = [client.stream(statement) for client in cluster.clients]
    try:
        batch = pipeline.feed([{"user": u, "clicks": 10 + i} for i, u in enumerate(users)])
        expected = pipeline.state(batch)
        for stream in streams:
            changes = [next(stream) for _ in users]
            assert sorted((c.key, c.row, c.batch_id) for c in changes) == [
                (u, expected[u], batch) for u in sorted(users)
            ]
        batch = pipeline.feed([{"user": users[0], "clicks": 1}, {"user": "not-watched"}])
        expected = pipeline.state(batch)
        for stream in streams:
            change = next(stream)
            assert (change.key, change.batch_id) == (users[0], batch)
            assert change.row == expected[users[0]]
            assert change.row == {"user": users[0], "count": 2, "sum": 11}
    finally:
        for stream in streams:
            stream.close()


def test_a_killed_node_leaves_its_standby_answering(pipeline: Pipeline, cluster: Cluster) -> None:
    """``kill -9`` of the node hosting half the partitions: the survivor, which holds every
    partition as active or standby, answers every key at once and follows the next batch."""
    cluster.up()
    batch = pipeline.feed([{"user": "before-kill", "clicks": 3}])
    cluster.wait_batch(batch)
    survivor, victim = cluster.clients[0], cluster.nodes[1]
    victim_active = get_json(f"{victim.url}/metadata")["nodes"]
    assert any(m["node_id"] == "n1" and m["active"].get(TABLE) for m in victim_active)
    victim.kill()
    expected = pipeline.state(batch)
    for user in expected:  # keys of every partition, half of them active on the dead node
        assert survivor.get(TABLE, user) == expected[user]
    rows = survivor.sql(f"SELECT user, count, sum FROM {TABLE}").rows
    assert {r["user"]: r for r in rows} == expected
    batch = pipeline.feed([{"user": "after-kill", "clicks": 4}, {"user": "u1", "clicks": 1}])
    deadline = time.monotonic() + 120
    while survivor.get(TABLE, "after-kill") is None:
        assert time.monotonic() < deadline, "the survivor did not follow the next batch"
        time.sleep(0.1)
    expected = pipeline.state(batch)
    rows = survivor.sql(f"SELECT user, count, sum FROM {TABLE}").rows
    assert {r["user"]: r for r in rows} == expected
    members = get_json(f"{cluster.nodes[0].url}/metadata")["nodes"]
    deadline = time.monotonic() + 60  # the failure detector's timeout, on a loaded machine
    while [m["node_id"] for m in members] != ["n0"]:
        assert time.monotonic() < deadline, members
        time.sleep(0.2)
        members = get_json(f"{cluster.nodes[0].url}/metadata")["nodes"]
    assert sorted(members[0]["active"][TABLE]) == list(range(PARTITIONS))


def test_app_attach_under_spark_connect(connect_spark: Any, tmp_path: Path) -> None:
    """``App.attach`` with a Spark Connect session: the query object is a Connect one (its
    ``lastProgress`` comes over gRPC), the state is written by the Connect server's JVM, the
    checkpoint is found under Spark's default location by the query's name, and the App
    serves it. A stateless query and a non-query are refused with what to do."""
    from pyspark.sql import functions as F

    spark = connect_spark
    source = JsonSource(tmp_path / "input", "user string, clicks long")
    source.write([{"user": "ann", "clicks": 2}, {"user": "bob", "clicks": 1}])
    source.write([{"user": "ann", "clicks": 5}])
    default = "spark.sql.streaming.checkpointLocation"
    spark.conf.set(default, str(tmp_path / "checkpoints"))
    try:
        query = (
            source.stream(spark)
            .groupBy("user")
            .agg(F.sum("clicks").alias("total"))
            .writeStream.format("noop")
            .outputMode("update")
            .queryName("connect_clicks")
            .start()
        )
        stateless = source.stream(spark).writeStream.format("noop").start()
    finally:
        spark.conf.unset(default)
    spark.conf.set(default, str(tmp_path / "checkpoints"))
    app = sparkiq.App(spark, state_dir=str(tmp_path / "state"), name="connect")
    app.start()
    try:
        query.processAllAvailable()
        stateless.processAllAvailable()
        batch = int(query.lastProgress["batchId"])
        assert app.attach(query, "cx") == ["cx_agg"]  # at <default>/connect_clicks
        assert app.node is not None and app.node.wait_for("cx_agg", batch, 60)
        checkpoint = str(tmp_path / "checkpoints" / "connect_clicks")
        frame = spark.read.format("statestore").option("batchId", batch).load(checkpoint)
        expected = {r["key"]["user"]: r["value"]["sum"] for r in frame.collect()}
        assert expected == {"ann": 7, "bob": 1}
        rows = app.sql("SELECT user, sum FROM cx_agg").rows
        assert {r["user"]: r["sum"] for r in rows} == expected
        assert app.get("cx_agg", "ann") == {"user": "ann", "sum": 7}
        with pytest.raises(ConfigError, match="no stateful operator"):
            app.attach(stateless, "plain")
        with pytest.raises(ConfigError, match="needs a StreamingQuery"):
            app.attach(frame, "frame")
        spark.conf.unset(default)
        # without checkpoint= and no default location: the error says what to pass
        with pytest.raises(ConfigError, match="pass checkpoint="):
            app.attach(query, "again")
        assert app.attach(query, "again", checkpoint=checkpoint) == ["again_agg"]
    finally:
        spark.conf.unset(default)
        app.stop()
        query.stop()
        stateless.stop()
