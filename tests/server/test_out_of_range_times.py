"""Times a caller reads at that no node can place (before year 1 or after year 9999 once
their offset is applied) are the caller's error: 400 with what the range is, on every path
that takes a time -- SQL ``AS OF TIMESTAMP``, REST ``as_of``, versioned key queries' ``as_of``,
``from`` and ``to``, and the Python query objects. Before, they answered 500 (an overflow
deep in a lookup). Against a real node on 127.0.0.1."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sparkiq import Node, RangeQuery, StateQueryRequest
from sparkiq.query.versioned import MultiVersionedKeyQuery, VersionedKeyQuery
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster

pytestmark = pytest.mark.timeout(120)

#: aware times whose UTC form is in year 0 or year 10000, whatever the node's time zone
OUT_OF_RANGE = (
    "0001-01-01 00:00:00+14:00",
    "9999-12-31 23:59:59-14:00",
    "0001-01-01T00:00:01+01:00",
)
RANGE = "between 0001-01-01 and 9999-12-31 in UTC"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    state_dir = str(tmp_path_factory.mktemp("times"))
    write_batch(make_table(state_dir, partitions=2), 0, {"a": 1, "b": 2})
    (node,) = start_http_cluster(state_dir, 1)
    yield node
    node.stop()


def sql(node: Node, text: str) -> httpx.Response:
    return http_calls.post(f"{node.url}/query", json={"sql": text}, headers=JSON, timeout=30)


def iq(node: Node, doc: dict[str, Any]) -> httpx.Response:
    return http_calls.post(f"{node.url}/stores/t/query", json=doc, headers=JSON, timeout=30)


def assert_out_of_range(response: httpx.Response, field: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    assert "out of range" in error["message"] and RANGE in error["message"], error


def test_sql_as_of_a_time_out_of_range_is_a_400(node: Node) -> None:
    for stamp in OUT_OF_RANGE:
        response = sql(node, f"SELECT k, n FROM t AS OF TIMESTAMP '{stamp}'")
        assert_out_of_range(response, "t")
        assert response.json()["error"]["code"] == "bad_as_of"
        assert stamp.replace(" ", "T") in response.json()["error"]["message"]
    # year 1 without an offset is local time: out of range, or before every batch
    response = sql(node, "SELECT k, n FROM t AS OF TIMESTAMP '0001-01-01 00:00:00'")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_as_of"
    # times in range: the far future reads the newest batch, the epoch's eve none
    for stamp in ("9999-12-31 00:00:00", "9999-12-31", "9999-12-30 23:59:59+14:00"):
        response = sql(node, f"SELECT k, n FROM t AS OF TIMESTAMP '{stamp}' ORDER BY k")
        assert response.status_code == 200, (stamp, response.text)
        assert response.json()["rows"] == [{"k": "a", "n": 1}, {"k": "b", "n": 2}]
    response = sql(node, "SELECT k FROM t AS OF TIMESTAMP '1969-12-31 23:59:59+00:00'")
    assert response.status_code == 400 and "no batch of 't'" in response.text


def test_rest_times_out_of_range_are_a_400(node: Node) -> None:
    for stamp in OUT_OF_RANGE:
        iso = stamp.replace(" ", "T")
        assert_out_of_range(iq(node, {"query": {"type": "range"}, "as_of": iso}), "as_of")
        versioned = {"type": "versioned_key", "key": "a", "as_of": iso}
        assert_out_of_range(iq(node, {"query": versioned}), "query.as_of")
        for bound in ("from", "to"):
            ranged = {"type": "multi_versioned_key", "key": "a", bound: iso}
            assert_out_of_range(iq(node, {"query": ranged}), f"query.{bound}")
    future = iq(node, {"query": {"type": "range"}, "as_of": "9999-12-31T00:00:00+00:00"})
    assert future.status_code == 200, future.text
    rows = [r for p in future.json()["partitions"].values() for r in p["rows"]]
    assert sorted(r["key"] for r in rows) == ["a", "b"]


def test_query_objects_refuse_times_out_of_range() -> None:
    early = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=14)))
    late = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-14)))
    for when in (early, late):
        with pytest.raises(ValueError, match=f"out of range: a time must fall {RANGE}"):
            StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds()).as_of_time(when)
        with pytest.raises(ValueError, match=r"as_of_time .* out of range"):
            VersionedKeyQuery.with_key("a").as_of(when)
        with pytest.raises(ValueError, match=r"time_to .* out of range"):
            MultiVersionedKeyQuery.with_key("a").to_time(when)
