"""A state_dir on S3 (a real S3 API served by moto on 127.0.0.1): executors write segments
through pyarrow's S3 filesystem, a node on another local directory reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App, ConfigError, Node, RangeQuery, StateQueryRequest
from sparkiq.changelog import Changelog


@pytest.fixture(scope="module")
def s3_uri() -> Iterator[str]:
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    admin = pafs.S3FileSystem(
        access_key="test",
        secret_key="test",
        endpoint_override=f"{host}:{port}",
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    admin.create_dir("sparkiq-test")
    yield f"s3://test:test@sparkiq-test/state?{options}"
    server.stop()


def test_changelog_on_s3_round_trips_through_spark_and_a_remote_node(
    spark: Any, s3_uri: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    source = tmp_path / "in"
    source.mkdir()
    rows = [{"k": f"k{i % 13}", "v": i} for i in range(200)]
    (source / "0.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = spark.readStream.schema("k string, v long").json(str(source))

    with pytest.raises(ConfigError, match="checkpoint_dir"):
        App(spark, state_dir=s3_uri)
    with pytest.raises(ConfigError, match="local_dir"):
        Node(s3_uri)

    app = App(
        spark,
        state_dir=s3_uri,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        local_dir=str(tmp_path / "app-replicas"),
    )
    app.materialize("sums", df.groupBy("k").agg(F.sum("v").alias("total")), key="k", partitions=4)
    app.start()
    try:
        app.process_all_available()
        truth = {
            r["k"]: r.asDict()
            for r in spark.read.schema("k string, v long")
            .json(str(source))
            .groupBy("k")
            .agg(F.sum("v").alias("total"))
            .collect()
        }
        assert {k: app.get("sums", k) for k in truth} == truth
        assert Changelog(s3_uri, "sums").committed_batch_ids() == [0]
        assert not (tmp_path / "state").exists()  # nothing of the changelog went to local disk

        with Node(s3_uri, node_id="remote", local_dir=str(tmp_path / "remote")) as node:
            node.poll_once()
            scan = node.query(
                StateQueryRequest.in_store("sums").with_query(RangeQuery.with_no_bounds())
            )
            got = {k: v for r in scan.partition_results.values() for k, v in r.result}
            assert got == truth
            assert scan.position.partition_offsets("sums") == {0: 0, 1: 0, 2: 0, 3: 0}
    finally:
        app.stop()
