"""The writer's side of a table where users look (``GET /stats``, ``/metrics``, ``sparkiq
status``) for the states that need no Spark: a record whose heartbeat is old (the driver was
killed without a word) shows silent with its age; a table without a record (an older writer)
shows "writer unknown", not an error; a torn record is unknown with the reason. The records
are written by hand, in the format the driver writes (sparkiq.changelog.writer_status); the
running, failed and stopped states a real App writes are checked in tests/spark/test_app.py
and tests/kafka/test_kafka_failures.py."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkiq import Node
from sparkiq.changelog import open_storage
from sparkiq.changelog.writer_status import WriterStatus, read_writer_status, write_writer_status
from sparkiq.serving.writer_view import MIN_SILENT_SECONDS
from tests import http_calls
from tests.browser import CHROMIUM, chromium, open_first_table
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import wait_until
from tests.kafka.test_kafka_lag import metric_samples


def writers(url: str) -> dict[str, dict[str, Any]]:
    return {w["table"]: w for w in http_calls.get(f"{url}/stats", timeout=30).json()["writers"]}


def status(state_dir: Path) -> str:
    command = [sys.executable, "-m", "sparkiq.cli", "status", "--state-dir", str(state_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_silent_unknown_and_torn_writers(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    for name in ("quiet", "legacy", "torn"):
        write_batch(make_table(str(tmp_path), name, partitions=1), 0, {"a": 1})
    # the driver of "quiet" last wrote 100 s ago (heartbeat every 2 s), saying it ran
    now = time.time()
    quiet = WriterStatus(
        table="quiet",
        state="running",
        written_at=now - 100,
        query_name="sparkiq.shop.quiet",
        batch_id=0,
        committed_at=now - 110,
        progress_batch_id=0,
        input_rows_per_second=12.5,
        processed_rows_per_second=40.0,
        batch_duration_ms=250.0,
    )
    write_writer_status(storage, quiet)
    assert read_writer_status(storage, "quiet") == quiet  # the format round-trips
    assert read_writer_status(storage, "legacy") is None
    torn = storage.path("tables", "torn", "writer.json")
    storage.write_atomic(torn, quiet.encode()[:-10])

    with Node(str(tmp_path), node_id="n", listen="127.0.0.1:0", standbys=0, store="memory") as n:
        url = n.url or ""
        wait_until(lambda: len(writers(url)) == 3, 120, "the node never served 3 tables")
        shown = writers(url)
        silent = shown["quiet"]
        assert silent["state"] == "silent" and 100 <= silent["heartbeat_age_seconds"] < 700
        assert silent["heartbeat_age_seconds"] > MIN_SILENT_SECONDS
        assert 110 <= silent["last_commit_age_seconds"] < 710 and silent["batch_id"] == 0
        assert silent["input_rows_per_second"] == 12.5 and silent["batch_duration_ms"] == 250.0
        assert shown["legacy"]["state"] == "unknown" and shown["legacy"]["error"] is None
        assert shown["torn"]["state"] == "unknown"
        assert "fails its checksum" in shown["torn"]["error"]
        # no samples for unknown writers; a silent one is down
        assert metric_samples(url, "sparkiq_writer_up") == {("quiet",): 0.0}
        assert metric_samples(url, "sparkiq_writer_state") == {
            ("silent", "quiet"): 1.0
        }  # labels by name: state, store
        assert metric_samples(url, "sparkiq_writer_batch_duration_seconds") == {("quiet",): 0.25}
        assert metric_samples(url, "sparkiq_writer_input_rows_per_second") == {("quiet",): 12.5}
        [age] = metric_samples(url, "sparkiq_writer_last_commit_age_seconds").values()
        assert 110 <= age < 710

        # the driver comes back and heartbeats: running again, within the node's refresh
        write_writer_status(storage, WriterStatus("quiet", "running", time.time(), batch_id=0))
        wait_until(lambda: writers(url)["quiet"]["state"] == "running", 120, "never running again")
        assert metric_samples(url, "sparkiq_writer_up") == {("quiet",): 1.0}
        # silent again, for sparkiq status
        again = time.time()
        write_writer_status(
            storage, replace(quiet, written_at=again - 100, committed_at=again - 110)
        )

    text = status(tmp_path)
    table_of = {name: text.split(f"\n{name} ")[1].split("\n", 2)[1] for name in ("quiet", "legacy")}
    # ages of 100 s and 110 s, when the status ran (a minute later at most)
    assert re.match(r"  writer SILENT: no heartbeat for 1\d\d s ", table_of["quiet"]), text
    assert re.search(r"; last commit batch 0 1\d\d s ago$", table_of["quiet"]), text
    assert table_of["legacy"].startswith("  writer unknown: no writer status record"), text
    assert "writer unknown: cannot read the writer status:" in text and "fails its checksum" in text


def test_a_writers_publishers_to_kafka_show_their_lag(tmp_path: Path) -> None:
    """The publishers an App runs (sparkiq.publish) are in its writer status record: their
    lag shows in ``GET /stats``, ``/metrics`` and ``sparkiq status``."""
    storage = open_storage(str(tmp_path))
    write_batch(make_table(str(tmp_path), "spent", partitions=1), 0, {"a": 1})
    publishing = (
        {
            "topic": "spent-out",
            "state": "publishing",
            "published_batch": 40,
            "head_batch": 43,
            "batches_behind": 3,
            "rows_behind": 1200,
            "error": None,
        },
        {
            "topic": "spent-audit",
            "state": "fenced",
            "published_batch": 12,
            "head_batch": 43,
            "batches_behind": 31,
            "rows_behind": 9000,
            "error": "another publisher took over",
        },
    )
    record = WriterStatus("spent", "running", time.time(), batch_id=43, publishing=publishing)
    write_writer_status(storage, record)
    assert read_writer_status(storage, "spent") == record
    # a record of a writer without publishers (older ones too) reads as none
    write_writer_status(storage, replace(record, publishing=()))
    assert read_writer_status(storage, "spent").publishing == ()  # type: ignore[union-attr]
    write_writer_status(storage, record)

    with Node(str(tmp_path), node_id="n", listen="127.0.0.1:0", standbys=0, store="memory") as n:
        url = n.url or ""
        wait_until(lambda: "spent" in writers(url), 120, "the node never served the table")
        assert writers(url)["spent"]["publishing"] == [dict(p) for p in publishing]
        labels = {("spent", "spent-out"), ("spent", "spent-audit")}
        assert set(metric_samples(url, "sparkiq_publish_lag_batches")) == labels
        assert metric_samples(url, "sparkiq_publish_lag_batches") == {
            ("spent", "spent-out"): 3.0,
            ("spent", "spent-audit"): 31.0,
        }
        assert metric_samples(url, "sparkiq_publish_lag_rows")[("spent", "spent-out")] == 1200.0
        assert metric_samples(url, "sparkiq_publish_up") == {
            ("spent", "spent-out"): 1.0,
            ("spent", "spent-audit"): 0.0,
        }
        if CHROMIUM is not None:  # the console's table view, under the writer
            with chromium() as browser:
                page = browser.new_page()
                open_first_table(page, url)
                page.wait_for_selector(".table-publishing")
                shown = page.inner_text("#table-writer")
                assert "Kafka topic spent-out: publishing, batch 40 of 43, 3 batches" in shown
                assert "Kafka topic spent-audit: fenced" in shown
    text = status(tmp_path)
    assert (
        "  publishing to Kafka topic 'spent-out': publishing, batch 40 of 43, 3 batches / "
        "1200 rows behind\n" in text
    ), text
    assert "'spent-audit': fenced, batch 12 of 43, 31 batches / 9000 rows behind; another " in text
