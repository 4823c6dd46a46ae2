"""Kafka lag where users look: ``sparkiq status``, ``GET /stats`` (the console's table view),
the console page itself and ``/metrics``, against a real broker.

A table's commit records carry ``kafka:<topic>`` positions as the sink writes them; here they
are committed with the changelog writer the tests use, naming a topic the broker really has
and the end offsets the broker acknowledged. A ``sparkiq serve --kafka-bootstrap`` node then
shows the offsets it applied and, after more records are produced, the lag to the broker's
real end offsets: checked against the acknowledged records (the ground truth) and the
broker's own watermarks. A node without a broker shows the applied offsets and says the lag
is unknown; a broker that does not answer shows as unreachable without holding requests up;
a node asked for a broker without the Kafka client says how to install it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkiq import Node
from sparkiq.changelog import Changelog
from sparkiq.testing import KafkaBroker
from tests import http_calls
from tests.browser import chromium, needs_chromium, open_first_table
from tests.browser import wait_until as page_wait_until
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import wait_until
from tests.cluster.serve_processes import free_port
from tests.kafka.client import Delivered, create_topic, end_offsets, produce
from tests.server.serve_subprocess import serving

TOPIC = "lag-orders"
PARTITIONS = 3
TABLE = "orders"


def acknowledged_ends(delivered: list[Delivered]) -> dict[int, int]:
    """Per partition, the end offset the acknowledged records imply: the last one's + 1."""
    ends = dict.fromkeys(range(PARTITIONS), 0)
    for record in delivered:
        ends[record.partition] = max(ends[record.partition], record.offset + 1)
    return ends


def records(start: int, count: int) -> list[tuple[str, str]]:
    return [(f"u-{i % 7}", f'{{"n": {i}}}') for i in range(start, start + count)]


@dataclass
class Lagging:
    """A table whose newest batch read the topic to ``applied``, a topic since produced to
    ``ends`` (``behind`` records per partition), and the nodes that serve the table."""

    state_dir: Path
    changelog: Changelog
    applied: dict[int, int]
    ends: dict[int, int]
    behind: dict[int, int]
    url: str  # a `sparkiq serve --kafka-bootstrap` node
    plain: Node  # a node without a broker


def stats(url: str) -> dict[str, Any]:
    return http_calls.get(f"{url}/stats", timeout=30).json()  # type: ignore[no-any-return]


def kafka_of(url: str) -> list[dict[str, Any]]:
    return [k for k in stats(url)["kafka"] if k["table"] == TABLE]


def metric_samples(url: str, name: str) -> dict[tuple[str, ...], float]:
    """``{label values: value}`` of one metric, read with Prometheus' own parser."""
    text = http_calls.get(f"{url}/metrics", timeout=30).text
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sample.labels[k] for k in sorted(sample.labels))] = sample.value
    return out


@pytest.fixture(scope="module")
def lagging(
    kafka_cluster: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lagging]:
    # the package-scoped broker: kafka_bootstrap is function-scoped (a ScopeMismatch here)
    kafka_bootstrap = kafka_cluster.bootstrap_servers
    state_dir = tmp_path_factory.mktemp("kafka-lag")
    create_topic(kafka_bootstrap, TOPIC, PARTITIONS)
    first = produce(kafka_bootstrap, TOPIC, records(0, 30))
    applied = acknowledged_ends(first)
    assert end_offsets(kafka_bootstrap, TOPIC, PARTITIONS) == applied
    changelog = make_table(str(state_dir), TABLE, partitions=2)
    rows: dict[str, int | None] = {f"u-{i}": i for i in range(7)}
    write_batch(changelog, 0, rows, position={f"kafka:{TOPIC}": applied})
    second = produce(kafka_bootstrap, TOPIC, records(30, 24))
    behind = dict(Counter(d.partition for d in second))
    ends = acknowledged_ends(first + second)
    assert sum(behind.values()) == 24 and all(behind.get(p) for p in range(PARTITIONS))
    assert end_offsets(kafka_bootstrap, TOPIC, PARTITIONS) == ends

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--state-dir", str(state_dir), "--listen", f"127.0.0.1:{port}", "--node-id", "lag"]
    args += ["--standbys", "0", "--kafka-bootstrap", kafka_bootstrap, "--kafka-interval", "0.5"]

    def fetched(_: Any) -> bool:
        # the node applied batch 0 and fetched the end offsets produced since
        found = kafka_of(url)
        return bool(found) and {p["partition"]: p["end"] for p in found[0]["partitions"]} == ends

    with (
        serving(args, state_dir, fetched, errors=(httpx.HTTPError,)),
        Node(str(state_dir), node_id="plain", listen="127.0.0.1:0", standbys=0) as plain,
    ):
        assert plain.wait_for(TABLE, 0, timeout=60)
        yield Lagging(state_dir, changelog, applied, ends, behind, url, plain)


def test_stats_show_applied_offsets_end_offsets_and_lag(lagging: Lagging) -> None:
    [source] = kafka_of(lagging.url)
    assert source["topic"] == TOPIC and source["broker"] == "ok" and source["error"] is None
    assert source["partitions"] == [
        {
            "partition": p,
            "applied": lagging.applied[p],
            "end": lagging.ends[p],
            "lag": lagging.behind[p],
        }
        for p in range(PARTITIONS)
    ]
    assert source["lag"] == 24
    assert 0 <= source["ends_age_seconds"] < 120  # fetched every 0.5 s


def test_a_node_without_a_broker_shows_applied_offsets_and_says_lag_is_unknown(
    lagging: Lagging,
) -> None:
    [source] = kafka_of(lagging.plain.url or "")
    assert source["broker"] == "none" and source["lag"] is None
    assert source["ends_fetched_at"] is None and source["ends_age_seconds"] is None
    assert [(p["applied"], p["end"], p["lag"]) for p in source["partitions"]] == [
        (lagging.applied[p], None, None) for p in range(PARTITIONS)
    ]
    applied = metric_samples(lagging.plain.url or "", "sparkiq_kafka_applied_offset")
    assert applied == {(str(p), TABLE, TOPIC): float(lagging.applied[p]) for p in range(PARTITIONS)}
    assert metric_samples(lagging.plain.url or "", "sparkiq_kafka_lag_records") == {}


def test_metrics_export_offsets_and_lag(lagging: Lagging) -> None:
    def labelled(values: dict[int, int]) -> dict[tuple[str, ...], float]:
        # labels sorted by name: partition, store, topic
        return {(str(p), TABLE, TOPIC): float(v) for p, v in values.items()}

    url = lagging.url
    assert metric_samples(url, "sparkiq_kafka_applied_offset") == labelled(lagging.applied)
    assert metric_samples(url, "sparkiq_kafka_end_offset") == labelled(lagging.ends)
    assert metric_samples(url, "sparkiq_kafka_lag_records") == labelled(lagging.behind)
    assert metric_samples(url, "sparkiq_kafka_broker_up") == {(TOPIC,): 1.0}
    [age] = metric_samples(url, "sparkiq_kafka_end_offsets_age_seconds").values()
    assert 0 <= age < 120


def test_status_shows_each_partition_and_its_lag(lagging: Lagging) -> None:
    # the nodes write status.json about once a second: wait for both to have the Kafka part
    def shown() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "sparkiq.cli", "status", "--state-dir", str(lagging.state_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    outputs: list[str] = []
    wait_until(
        lambda: outputs.append(shown()) or outputs[-1].count(f"topic {TOPIC!r}") == 3,
        120,
        f"no Kafka section for both nodes: {outputs[-1:]}",
    )
    text = outputs[-1]
    read = " ".join(f"{p}:{lagging.applied[p]}" for p in range(PARTITIONS))
    assert f"kafka topic {TOPIC!r} read to offsets {read} (batch 0)" in text
    node_lag, node_plain = text.split("\nnode 'lag'")[1], text.split("\nnode 'plain'")[1]
    node_lag = node_lag.split("\nnode ")[0]
    node_plain = node_plain.split("\nnode ")[0]
    assert "kafka sources (end offsets from 127.0.0.1:" in node_lag
    assert f"{TABLE} <- topic {TOPIC!r}: lag 24 records, end offsets" in node_lag
    for p in range(PARTITIONS):
        row = f"{p:>9} {lagging.applied[p]:>12} {lagging.ends[p]:>12} {lagging.behind[p]:>10}"
        assert row in node_lag, (row, node_lag)
        assert f"{p:>9} {lagging.applied[p]:>12} {'-':>12} {'-':>10}" in node_plain
    assert "lag unknown: the node has no --kafka-bootstrap" in node_plain


@needs_chromium
def test_the_console_table_view_shows_kafka_lag(lagging: Lagging) -> None:
    with chromium() as browser:
        page = browser.new_page()
        open_first_table(page, lagging.url)
        page.wait_for_selector(f'#table-kafka table[data-topic="{TOPIC}"] tbody tr')
        page_wait_until(page, "document.querySelectorAll('#table-kafka tbody tr').length === 3")
        cells = page.eval_on_selector_all(
            "#table-kafka tbody tr",
            "rows => rows.map(r => [...r.cells].map(c => c.textContent))",
        )
        assert cells == [
            [str(p), str(lagging.applied[p]), str(lagging.ends[p]), str(lagging.behind[p])]
            for p in range(PARTITIONS)
        ]
        summary = page.inner_text("#table-kafka")
        assert f"topic {TOPIC}" in summary and "lag 24 records" in summary
        assert "end offsets" in summary and "s old" in summary

        open_first_table(page, lagging.plain.url)
        page.wait_for_selector("#table-kafka table tbody tr")
        assert "lag unknown: the node was started without --kafka-bootstrap" in (
            page.inner_text("#table-kafka")
        )


def test_applying_the_produced_records_clears_the_lag(lagging: Lagging) -> None:
    write_batch(lagging.changelog, 1, {"u-0": 100}, position={f"kafka:{TOPIC}": lagging.ends})

    def caught_up() -> bool:
        [source] = kafka_of(lagging.url)
        return [p["applied"] for p in source["partitions"]] == [
            lagging.ends[p] for p in range(PARTITIONS)
        ]

    wait_until(caught_up, 120, "the node never applied batch 1's offsets")
    [source] = kafka_of(lagging.url)
    assert [p["lag"] for p in source["partitions"]] == [0] * PARTITIONS and source["lag"] == 0
    lags = metric_samples(lagging.url, "sparkiq_kafka_lag_records")
    assert lags == {(str(p), TABLE, TOPIC): 0.0 for p in range(PARTITIONS)}


# -- a broker that does not answer, and no Kafka client ------------------------------------


def test_a_broker_that_does_not_answer_shows_as_unreachable_and_holds_nothing_up(
    tmp_path: Path,
) -> None:
    changelog = make_table(str(tmp_path), TABLE, partitions=2)
    write_batch(changelog, 0, {"u-1": 1}, position={f"kafka:{TOPIC}": {0: 5, 1: 7}})
    # a "broker" that accepts connections and never answers: each fetch waits its timeout
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    bootstrap = f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        node = Node(
            str(tmp_path),
            node_id="silent",
            listen="127.0.0.1:0",
            standbys=0,
            kafka_bootstrap=bootstrap,
            kafka_interval=2.5,  # each request may take 5 s
        )
        started = time.monotonic()
        with node:
            assert node.wait_for(TABLE, 0, timeout=60)
            # the first round still waits on the broker (5 s), and requests are answered: a
            # request that waited for the round would find it ended (unreachable)
            asked = time.monotonic() - started
            [source] = kafka_of(node.url or "")
            if asked < 3.5:  # no claim on a machine too busy to tell
                assert source["broker"] == "pending", source
            assert [(p["applied"], p["end"]) for p in source["partitions"]] == [
                (5, None),
                (7, None),
            ]
            wait_until(
                lambda: kafka_of(node.url or "")[0]["broker"] == "unreachable",
                120,
                "the silent broker never showed as unreachable",
            )
            [source] = kafka_of(node.url or "")
            assert source["error"] and source["lag"] is None and source["ends_age_seconds"] is None
            assert metric_samples(node.url or "", "sparkiq_kafka_broker_up") == {(TOPIC,): 0.0}
            node.write_status_file()
            status = subprocess.run(
                [sys.executable, "-m", "sparkiq.cli", "status", "--state-dir", str(tmp_path)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert f"{TABLE} <- topic {TOPIC!r}: broker unreachable: {source['error']}" in (
                status.stdout
            ), status.stdout
            stopping = time.monotonic()
        # stopping does not wait for a request in flight (the next round is under way)
        assert time.monotonic() - stopping < 60
    finally:
        silent.close()


def test_a_broker_without_the_kafka_client_says_how_to_install_it(tmp_path: Path) -> None:
    make_table(str(tmp_path), TABLE, partitions=1)
    # the interpreter as it is without confluent-kafka: importing it fails
    code = (
        "import sys; sys.modules['confluent_kafka'] = None; from sparkiq.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    args = ["serve", "--state-dir", str(tmp_path), "--listen", "127.0.0.1:0"]
    result = subprocess.run(
        [sys.executable, "-c", code, *args, "--kafka-bootstrap", "127.0.0.1:9092"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs the Kafka client confluent-kafka" in result.stderr
    assert "pip install 'sparkiq[kafka]'" in result.stderr
