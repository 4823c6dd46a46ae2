"""Versioned key queries over HTTP: ``POST /stores/{store}/query`` JSON and ``Client.query``
against a two-node cluster on 127.0.0.1, checked against the plain-Python model of every
key's history (tests/cluster/versioned_history.py); the Client returns the same
VersionedRecord values as the in-process node."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from sparkiq import (
    Client,
    FailureReason,
    MultiVersionedKeyQuery,
    Node,
    StateQueryRequest,
    VersionedKeyQuery,
    VersionedRecord,
)
from sparkiq.stores.history import History
from sparkiq.wire import jsonapi
from tests import http_calls
from tests.cluster.cluster_helpers import start_http_cluster
from tests.cluster.versioned_history import KEYS, Model, make_history_table

TOKEN = "versioned-token"
WINDOW = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Node], Model]]:
    state_dir = str(tmp_path_factory.mktemp("versioned"))
    changelog = make_history_table(state_dir, History(batches=WINDOW))
    model = Model()
    model.write_random(changelog, 10, random.Random(7))
    nodes = start_http_cluster(state_dir, 2, token=TOKEN, standbys=0)
    yield nodes, model
    for node in reversed(nodes):
        node.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with http_calls.new_client(timeout=30.0) as client:  # building one per request costs ~100 ms
        yield client


def post(http: httpx.Client, node: Node, query: dict[str, Any]) -> httpx.Response:
    return http.post(
        f"{node.url}/stores/t/query",
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        content=orjson.dumps({"query": query}),
    )


def only_partition(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    partitions = response.json()["partitions"]
    assert len(partitions) == 1, partitions
    answer: dict[str, Any] = next(iter(partitions.values()))
    return answer


def as_json(value: Any) -> Any:
    """What the REST API renders ``value`` (records, lists of them) as."""
    return orjson.loads(jsonapi.dumps(value))


def test_rest_answers_equal_the_model_on_every_node(
    cluster: tuple[list[Node], Model], http: httpx.Client
) -> None:
    nodes, model = cluster
    oldest = model.newest - WINDOW
    for node in nodes:
        for key in KEYS:
            for batch_id in (oldest, oldest + 2, model.newest):
                answer = only_partition(
                    post(http, node, {"type": "versioned_key", "key": key, "as_of": batch_id})
                )
                assert answer["result"] == as_json(model.version_at(key, oldest, batch_id))
            when = model.between(oldest + 1).isoformat()
            answer = only_partition(
                post(http, node, {"type": "versioned_key", "key": key, "as_of": when})
            )
            assert answer["result"] == as_json(model.version_at(key, oldest, oldest + 1))
            answer = only_partition(
                post(
                    http,
                    node,
                    {
                        "type": "multi_versioned_key",
                        "key": key,
                        "from": model.between(oldest + 1).isoformat(),
                        "to_batch": model.newest - 1,
                        "order": "descending",
                    },
                )
            )
            expected = [
                r
                for r in model.versions(key, oldest)
                if r.valid_from <= model.newest - 1
                and (r.valid_to is None or r.valid_to > oldest + 1)
            ]
            assert answer["result"] == as_json(expected[::-1])


def test_client_returns_the_same_records_as_the_node(cluster: tuple[list[Node], Model]) -> None:
    nodes, model = cluster
    oldest = model.newest - WINDOW
    with Client([n.url for n in nodes], token=TOKEN) as client:
        for key in KEYS:
            for query in (
                VersionedKeyQuery.with_key(key),
                VersionedKeyQuery.with_key(key).as_of(oldest + 1),
                VersionedKeyQuery.with_key(key).as_of(model.between(oldest + 3)),
                MultiVersionedKeyQuery.with_key(key),
                MultiVersionedKeyQuery.with_key(key).from_batch(oldest + 2),
            ):
                request = StateQueryRequest.in_store("t").with_query(query)
                over_http = client.query(request).only_partition_result()
                in_process = nodes[0].query(request).only_partition_result()
                assert over_http.is_success, over_http
                assert over_http.result == in_process.result
                assert over_http.position == in_process.position
            record = client.query(
                StateQueryRequest.in_store("t").with_query(VersionedKeyQuery.with_key(key))
            ).only_partition_result()
            assert record.result == model.version_at(key, oldest, model.newest)
            assert record.result is None or isinstance(record.result, VersionedRecord)
            history = client.query(
                StateQueryRequest.in_store("t").with_query(MultiVersionedKeyQuery.with_key(key))
            ).only_partition_result()
            assert history.result == model.versions(key, oldest)


def test_beyond_the_history_over_rest_and_client(
    cluster: tuple[list[Node], Model], http: httpx.Client
) -> None:
    nodes, model = cluster
    oldest = model.newest - WINDOW
    answer = only_partition(
        post(http, nodes[1], {"type": "versioned_key", "key": KEYS[0], "as_of": oldest - 1})
    )
    assert answer["failure"]["reason"] == "NOT_UP_TO_BOUND"
    assert f"the oldest batch still readable is {oldest}" in answer["failure"]["message"]
    with Client(nodes[0].url, token=TOKEN, bound_wait=0.0) as client:
        query = MultiVersionedKeyQuery.with_key(KEYS[0]).to_time(model.between(oldest - 1))
        result = client.query(StateQueryRequest.in_store("t").with_query(query))
        failed = result.only_partition_result()
        assert failed.failure_reason is FailureReason.NOT_UP_TO_BOUND
        assert f"the oldest batch still readable is {oldest}" in (failed.failure_message or "")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"type": "versioned_key"}, "query.key"),
        ({"type": "versioned_key", "key": "a", "as_of": -4}, "query.as_of"),
        ({"type": "versioned_key", "key": "a", "as_of": "last tuesday"}, "query.as_of"),
        ({"type": "multi_versioned_key", "key": "a", "order": "newest"}, "query.order"),
        ({"type": "multi_versioned_key", "key": "a", "to": 12}, "query.to"),
        ({"type": "multi_versioned_key", "key": "a", "from_batch": 3, "to_batch": 1}, "query"),
    ],
)
def test_bad_requests_get_a_400_naming_the_field(
    cluster: tuple[list[Node], Model], http: httpx.Client, query: dict[str, Any], field: str
) -> None:
    response = post(http, cluster[0][0], query)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field and error["message"], error
