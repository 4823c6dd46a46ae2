"""The REST API on real HTTP servers on 127.0.0.1: answers, errors, auth, streaming."""

from __future__ import annotations

import datetime as dt
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sparkiq import (
    AuthenticationError,
    Client,
    KeyQuery,
    Node,
    RangeQuery,
    ResultOrder,
    StateQueryRequest,
    UnknownStoreError,
)
from sparkiq.errors import InvalidQueryError
from sparkiq.stores.rocksdb_options import BLOCK_CACHE_BYTES, MEMTABLE_BUDGET_BYTES
from tests import http_calls
from tests.changelog.helpers import (
    apply_changes,
    create_changelog,
    expected_rows,
    make_table,
    make_wide_table,
    write_batch,
    write_rows,
)
from tests.cluster.cluster_helpers import start_http_cluster

TOKEN = "s3cret-token"
HISTORY: list[dict[str, int | None]] = [
    {f"k{i:05d}": i for i in range(5000)},
    {f"k{i:05d}": None for i in range(0, 5000, 9)},
]
WIDE = [
    {
        f"w{i}": {
            "k": f"w{i}",
            "n": i,
            "tag": "red" if i % 2 else None,
            "price": i / 4,
            "day": dt.date(2024, 1, 1) + dt.timedelta(days=i),
            "info": {"a": i, "tags": ["x", str(i)]},
        }
        for i in range(40)
    }
]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    state_dir = str(tmp_path_factory.mktemp("rest"))
    changelog = make_table(state_dir, partitions=4)
    for batch_id, rows in enumerate(HISTORY):
        write_batch(changelog, batch_id, rows)
    write_rows(make_wide_table(state_dir, partitions=3), 0, WIDE[0])
    started = start_http_cluster(state_dir, 2, token=TOKEN)
    yield started
    for node in reversed(started):
        node.stop()


def auth() -> dict[str, str]:
    # POSTs must name their type (a node refuses those any web page may send); GETs ignore it
    return {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


def url(node: Node, path: str) -> str:
    return f"{node.url}{path}"


def test_key_lookup_on_every_node(nodes: list[Node]) -> None:
    expected = expected_rows(HISTORY)
    for node in nodes:
        for i in range(0, 5000, 97):
            key = f"k{i:05d}"
            response = http_calls.get(url(node, f"/stores/t/keys/{key}"), headers=auth())
            if key in expected:
                assert response.status_code == 200
                doc = response.json()
                assert doc["row"] == expected[key]
                assert doc["partition"] == node.partition_for_key("t", key)
                assert doc["position"].startswith("p1.")
            else:
                assert response.status_code == 404
                assert response.json()["error"]["code"] == "key_not_found"


def test_wrong_or_missing_token_gets_401_and_no_data(nodes: list[Node]) -> None:
    node = nodes[0]
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic x"}):
        for method, path, body in [
            ("GET", "/stores/t/keys/k00001", None),
            ("POST", "/stores/t/query", b'{"query": {"type": "range"}}'),
            ("GET", "/metadata", None),
            ("GET", "/stores", None),
            ("GET", "/metrics", None),
            ("POST", "/query", b'{"sql": "SELECT * FROM t"}'),
            ("POST", "/internal/query", b"\x80"),
            ("POST", "/internal/heartbeat", b"\x80"),
        ]:
            typed = headers | {"content-type": "application/json"}
            response = http_calls.request(method, url(node, path), headers=typed, content=body)
            assert response.status_code == 401, (path, headers)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "k00001" not in response.text and '"row"' not in response.text
            assert response.json()["error"]["code"] == "unauthorized"
    assert http_calls.get(url(node, "/healthz")).status_code == 200  # probes need no token
    assert http_calls.get(url(node, "/openapi.json")).json()["openapi"].startswith("3.1")


def test_client_with_a_wrong_token_is_refused(nodes: list[Node]) -> None:
    with Client(nodes[0].url, token="wrong") as client, pytest.raises(AuthenticationError):
        client.get("t", "k00001")


def test_errors_name_the_offending_field(nodes: list[Node]) -> None:
    node = nodes[1]

    def post(path: str, body: bytes) -> httpx.Response:
        return http_calls.post(url(node, path), headers=auth(), content=body)

    cases = [
        (post("/stores/t/query", b"{not json"), 400, "body"),
        (post("/stores/t/query", b"[1, 2]"), 400, "body"),
        (post("/stores/t/query", b'{"query": {"type": "nearest"}}'), 400, "query.type"),
        (post("/stores/t/query", b'{"query": {"type": "key"}}'), 400, "query.key"),
        (post("/stores/t/query", b'{"query": {"type": "key", "key": 5}}'), 400, "query.key"),
        (
            post("/stores/t/query", b'{"query": {"type": "range", "lower": [1]}}'),
            400,
            "query.lower",
        ),
        (
            post("/stores/t/query", b'{"query": {"type": "range", "order": "up"}}'),
            400,
            "query.order",
        ),
        (post("/stores/t/query", b'{"query": {"type": "range"}, "bound": "xx"}'), 400, "bound"),
        (
            post("/stores/t/query", b'{"query": {"type": "range"}, "partitions": "all"}'),
            400,
            "partitions",
        ),
        (post("/stores/t/query", b'{"query": {"type": "range"}, "limit": 3}'), 400, "limit"),
        (post("/stores/nope/query", b'{"query": {"type": "range"}}'), 404, "store"),
        (http_calls.get(url(node, "/stores/nope/keys/a"), headers=auth()), 404, "store"),
        (http_calls.get(url(node, "/stores/w/keys/w1"), headers=auth()), 200, None),
        (post("/stores/t/query", b"x" * (2 << 20)), 413, "body"),
        (post("/query", b'{"statement": "SELECT 1"}'), 400, "sql"),
        (post("/internal/query", b"\xc1garbage"), 400, None),
    ]
    for response, status, field in cases:
        assert response.status_code == status, response.text
        if status != 200:
            error = response.json()["error"]
            assert error["field"] == field, error
            assert error["message"]
            assert "Traceback" not in response.text
    unknown = http_calls.get(url(node, "/no/such/route"), headers=auth())
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    wrong_method = http_calls.delete(url(node, "/stores/t/keys/k1"), headers=auth())
    assert wrong_method.status_code == 405


def test_typed_keys_are_parsed_by_column_type(tmp_path: Path) -> None:
    """Keys of a date column arrive as ISO text; a bad date names the field."""

    schema_json = {
        "type": "struct",
        "fields": [
            {"name": "day", "type": "date", "nullable": True, "metadata": {}},
            {"name": "n", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
    changelog = create_changelog(str(tmp_path), "days", schema_json, ["day"], partitions=2)
    days = {dt.date(2024, 5, i): {"day": dt.date(2024, 5, i), "n": i} for i in range(1, 9)}
    write_rows(changelog, 0, days)
    with Node(str(tmp_path), node_id="solo", listen="127.0.0.1:0") as node:
        node.poll_once()
        ok = http_calls.get(url(node, "/stores/days/keys/2024-05-03"))
        assert ok.json()["row"] == {"day": "2024-05-03", "n": 3}
        bad = http_calls.get(url(node, "/stores/days/keys/May-3"))
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "key"
        assert "date" in bad.json()["error"]["message"]
        with Client(node.url) as client:
            assert client.get("days", dt.date(2024, 5, 3)) == {"day": dt.date(2024, 5, 3), "n": 3}
            meta = client.metadata_for_key("days", dt.date(2024, 5, 3))
            assert meta.partition == node.partition_for_key("days", dt.date(2024, 5, 3))


def test_keys_with_percent_signs_and_slashes_are_read_once_decoded(tmp_path: Path) -> None:
    """A key's URL text is percent-decoded once: ``a%25b`` is the key ``a%b`` (decoded
    twice it was ``a%b`` read as ``a`` + an escape), and ``x%2Fy`` is ``x/y``, one segment."""
    keys = ["a%b", "a%25b", "x/y", "50% off", "plain"]
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {k: i for i, k in enumerate(keys)})
    with Node(str(tmp_path), node_id="solo", listen="127.0.0.1:0") as node:
        node.poll_once()
        for i, key in enumerate(keys):
            quoted = urllib.parse.quote(key, safe="")
            response = http_calls.get(url(node, f"/stores/t/keys/{quoted}"))
            assert response.status_code == 200, (key, response.text)
            assert response.json()["row"] == expected_rows([{key: i}])[key]
        with Client(node.url) as client:
            assert [client.get("t", k) for k in keys] == [node.get("t", k) for k in keys]


def test_large_ranges_stream_in_pieces(nodes: list[Node]) -> None:
    expected = expected_rows(HISTORY)
    body = orjson.dumps({"query": {"type": "range", "order": "ascending"}})
    pieces = 0
    with http_calls.stream(
        "POST", url(nodes[0], "/stores/t/query"), headers=auth(), content=body
    ) as r:
        assert r.status_code == 200
        data = b""
        for chunk in r.iter_raw():
            pieces += 1
            data += chunk
    assert pieces > 1  # the body was sent as it was produced, not in one buffer
    doc = orjson.loads(data)
    rows = {item["key"]: item["row"] for p in doc["partitions"].values() for item in p["rows"]}
    assert rows == expected
    for partition_doc in doc["partitions"].values():
        keys = [item["key"] for item in partition_doc["rows"]]
        assert keys == sorted(keys)
    assert doc["position"].startswith("p1.")


def test_client_gives_the_in_process_types_and_streams_ranges(nodes: list[Node]) -> None:
    expected = apply_changes(WIDE)
    with Client([node.url for node in nodes], token=TOKEN) as client:
        for key, row in expected.items():
            assert client.get("w", key) == row  # dates, structs, floats as in-process
        result = client.query(
            StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
        )
        assert len(result.partition_results) == 4
        rows = {k: v for r in result.partition_results.values() for k, v in r.result}
        assert rows == expected_rows(HISTORY)
        descending = client.query(
            StateQueryRequest.in_store("t")
            .with_query(
                RangeQuery.with_range("k00100", "k00200").with_result_order(ResultOrder.DESCENDING)
            )
            .with_partitions([0])
        )
        keys = [k for k, _ in descending.partition_results[0].result]
        assert keys == sorted(keys, reverse=True) and keys
        with pytest.raises(UnknownStoreError):
            client.query(StateQueryRequest.in_store("nope").with_query(RangeQuery.with_no_bounds()))
        with pytest.raises(InvalidQueryError):
            client.get("t", 42)


def test_client_retries_on_another_node_when_one_is_down(nodes: list[Node]) -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    with Client([dead, nodes[1].url], token=TOKEN) as client:
        assert client.get("t", "k00001") == {"k": "k00001", "n": 1}
        meta = client.metadata_for_key("t", "k00001")
        assert meta.active_host is not None
        assert {meta.active_host.node_id, *(h.node_id for h in meta.standby_hosts)} == {"n0", "n1"}


def test_client_positions_never_go_back(nodes: list[Node]) -> None:
    with Client(nodes[0].url, token=TOKEN) as client:
        first = client.query(
            StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("k00001"))
        )
        later = client.query(
            StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("k00002"))
        )
        assert later.position.to_map()["t"] and first.position.to_map()["t"]
        assert max(later.position.to_map()["t"].values()) >= max(
            first.position.to_map()["t"].values()
        )


def test_metadata_readiness_and_metrics(nodes: list[Node]) -> None:
    node = nodes[0]
    doc = http_calls.get(url(node, "/metadata"), headers=auth()).json()
    assert sorted(n["node_id"] for n in doc["nodes"]) == ["n0", "n1"]
    key = urllib.parse.quote("k00042")
    meta = http_calls.get(url(node, f"/metadata/stores/t/keys/{key}"), headers=auth()).json()
    assert meta["partition"] == node.partition_for_key("t", "k00042")
    ready = http_calls.get(url(node, "/readyz"))
    assert ready.status_code == 200 and ready.json()["ready"] is True
    stores = http_calls.get(url(node, "/stores"), headers=auth()).json()["stores"]
    assert {s["name"]: s["partitions"] for s in stores} == {"t": 4, "w": 3}
    history = {s["name"]: s["history"] for s in stores}["t"]
    assert (history["batches"], history["seconds"]) == (0, 300.0)  # the default: 5 minutes
    assert history["newest_batch"] == 1 and 0 <= history["oldest_batch"] <= 1
    # a key lookup of its own, so that the test stands alone (not after another test's)
    assert http_calls.get(url(node, f"/stores/t/keys/{key}"), headers=auth()).status_code == 200
    metrics = http_calls.get(url(node, "/metrics"), headers=auth()).text
    assert 'sparkiq_replica_batch_id{partition="0",store="t"} 1.0' in metrics
    assert "sparkiq_cluster_live_members 2.0" in metrics
    assert 'sparkiq_http_requests_total{route="/stores/{store}/keys/{key}",status="200"}' in metrics
    # threads by pool: the two nodes share this process, so each has a heartbeat thread here
    pools = _labelled(metrics, "sparkiq_threads")
    assert pools["sparkiq-heartbeat-n0"] == pools["sparkiq-heartbeat-n1"] == 1
    assert pools["MainThread"] == 1
    # each pool's bound, summed over the two nodes' pools; a pool never holds more
    limits = _labelled(metrics, "sparkiq_thread_pool_limit")
    assert limits["sparkiq-router"] >= 2 * 32 and limits["sparkiq-subrequest"] >= 2 * 64
    assert all(pools.get(pool, 0) <= limit for pool, limit in limits.items())
    # the replicas' RocksDB memory, shared by the process, next to its bounds
    used = _labelled(metrics, "sparkiq_rocksdb_memory_bytes")
    bound = _labelled(metrics, "sparkiq_rocksdb_memory_limit_bytes")
    assert bound == {"block_cache": BLOCK_CACHE_BYTES, "memtables": MEMTABLE_BUDGET_BYTES}
    assert 0 < used["memtables"] <= bound["memtables"]  # the replicas hold batch 1
    assert 0 <= used["block_cache"] <= bound["block_cache"]
    # the process's memory by part, read from /proc and glibc's own accounting
    process = _labelled(metrics, "sparkiq_process_memory_bytes")
    assert set(process) == {"resident", "malloc_in_use", "malloc_free_held", "arrow"}
    assert process["resident"] > process["malloc_in_use"] > 0 and process["arrow"] > 0
    assert process["resident"] > process["arrow"] + process["malloc_in_use"]


def test_membership_bytes_counted_on_both_sides(nodes: list[Node]) -> None:
    # every byte one member sends (a request, or the reply it gives) the other receives, so
    # over the two nodes sent and received agree, save the message or two in flight between
    # the reads: once enough has been sent that those are a small share
    deadline = time.monotonic() + 60
    while True:
        sent = received = 0.0
        for node in nodes:
            text = http_calls.get(url(node, "/metrics"), headers=auth()).text
            traffic = _labelled(text, "sparkiq_membership_bytes_total")
            sent, received = sent + traffic["sent"], received + traffic["received"]
        if sent >= 3000 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sent >= 3000 and abs(sent - received) <= 0.15 * sent, (sent, received)


def _labelled(metrics: str, name: str) -> dict[str, float]:
    """The gauge ``name``'s value by its one label's value."""
    return {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{")
    }


def test_openapi_documents_every_route(nodes: list[Node]) -> None:
    doc = http_calls.get(url(nodes[0], "/openapi.json")).json()
    assert {
        "/healthz",
        "/readyz",
        "/metrics",
        "/stores",
        "/stores/{store}/keys/{key}",
        "/stores/{store}/query",
        "/metadata",
        "/metadata/stores/{store}/keys/{key}",
        "/query",
    } <= set(doc["paths"])


def test_the_console_page_is_served_without_a_token(nodes: list[Node]) -> None:
    page = http_calls.get(url(nodes[0], "/"))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>sparkiq console</title>" in page.text
    assert 'fetch("/query"' in page.text  # it queries the same API, with the user's token
    assert http_calls.get(url(nodes[0], "/console")).text == page.text


def test_sql_over_rest_reads_only_and_explains_errors(nodes: list[Node]) -> None:
    def sql(text: str) -> httpx.Response:
        return http_calls.post(
            url(nodes[1], "/query"), headers=auth(), content=orjson.dumps({"sql": text})
        )

    ok = sql("SELECT k, n FROM t WHERE k = 'k00003'")
    assert ok.status_code == 200
    assert ok.json()["rows"] == [{"k": "k00003", "n": 3}] and ok.json()["position"].startswith(
        "p1."
    )
    for statement in (
        "CREATE TABLE x WITH (KEY = 'k') AS SELECT * FROM t",
        "DROP TABLE t",
        "INSERT INTO t VALUES ('a', 1)",
        "SELECT * FROM read_csv('/etc/passwd')",
        "COPY t TO '/tmp/out.csv'",
    ):
        refused = sql(statement)
        assert refused.status_code == 400, statement
        assert "Traceback" not in refused.text
    syntax = sql("SELECT k,\n  FROM t WHERE")
    error = syntax.json()["error"]
    assert syntax.status_code == 400 and error["line"] >= 1 and error["column"] >= 1
    assert "^" in error["snippet"]
    unknown = sql("SELECT kk FROM t").json()["error"]
    assert "k" in unknown["candidates"]
    assert sql("SELECT * FROM tt").json()["error"]["candidates"] == ["t"]


def test_sql_key_lookups_answer_alike_on_the_event_loop_or_a_thread(nodes: list[Node]) -> None:
    """A key lookup of a planned shape is answered on the event loop when the node reads
    the key itself (Node.sql_here; with a standby each node holds every partition), with
    the rows and position Node.sql gives."""
    expected = expected_rows(HISTORY)
    for node in nodes:
        here = 0
        for i in range(0, 5000, 211):
            key = f"k{i:05d}"
            text = f"SELECT k, n FROM t WHERE k = '{key}'"
            body = orjson.dumps({"sql": text})
            answer = http_calls.post(url(node, "/query"), headers=auth(), content=body)
            assert answer.status_code == 200
            doc = answer.json()
            want = [{"k": key, "n": expected[key]["n"]}] if key in expected else []
            assert doc["rows"] == want and doc["columns"] == ["k", "n"]
            direct = node.sql(text)
            assert doc["position"] == direct.position.to_token()
            here += node.sql_here(text) is not None
        assert here > 0  # the loop's path was taken
