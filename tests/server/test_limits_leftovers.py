"""Leftovers of the hostile-input work: partition failures in streamed IQv2 results and
push query errors are scrubbed like the REST API's errors, and ``/metrics`` counts hedged
sub-requests."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import orjson

from sparkiq import Client
from sparkiq.errors import InvalidQueryError
from sparkiq.query.position import Position
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.server.streams import iq_json_chunks, push_stream
from tests import http_calls
from tests.server.test_hostile import TOKEN, Hostile, auth
from tests.server.test_limits_http import limited  # noqa: F401  # the fixture

REPLICA = "/var/lib/sparkiq/replicas/n0/ik/2/rocksdb"
RELATIVE = "state/replicas/n0"


def test_partition_failures_in_iq_results_carry_no_paths() -> None:
    results = StateQueryResult(
        {
            0: QueryResult.for_result(5, Position.from_map({"ik": {0: 3}})),
            2: QueryResult.for_failure(
                FailureReason.STORE_EXCEPTION,
                f"RocksDB store at '{REPLICA}/LOCK' failed (<class 'rocksdict.RdictError'>); "
                f"see {RELATIVE}/ik/2 for partition 2",
            ),
        }
    )
    doc = orjson.loads(b"".join(iq_json_chunks("ik", results, ("state",))))
    failure = doc["partitions"]["2"]["failure"]
    assert failure["reason"] == "STORE_EXCEPTION"
    assert failure["message"] == (
        "RocksDB store at '<path>' failed (a value); see <path> for partition 2"
    )
    assert doc["partitions"]["0"]["result"] == 5


class _Failing:
    """A push subscription whose next poll fails with ``error`` (what a subscription
    raises when its replica fails or the client reads too slowly)."""

    closed = False

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def poll_chunk_async(self, timeout: float, executor: Any = None) -> Any:
        raise self.error

    def close(self) -> None:
        self.closed = True


def test_push_errors_carry_no_paths() -> None:
    subscription = _Failing(InvalidQueryError(f"replica at {REPLICA} failed: disk full"))

    async def read() -> list[bytes]:
        return [line async for line in push_stream(subscription)]

    lines = asyncio.run(read())
    assert subscription.closed
    assert [orjson.loads(line) for line in lines] == [
        {"error": {"code": "push_failed", "message": "replica at <path> failed: disk full"}}
    ]


def test_metrics_count_hedged_sub_requests(limited: Hostile) -> None:  # noqa: F811
    coordinator = limited.node.coordinator
    assert coordinator is not None

    def hedged() -> float:
        text = http_calls.get(limited.url("/metrics"), headers=auth(), timeout=10).text
        line = next(x for x in text.splitlines() if x.startswith("sparkiq_router_hedged "))
        return float(line.split()[1])

    assert hedged() == coordinator.router.hedged == 0
    coordinator.router.hedged += 2  # what two hedges do (see Router._attempt)
    try:
        assert hedged() == 2
    finally:
        coordinator.router.hedged -= 2


def test_integers_beyond_64_bits_reach_json_and_binary_clients(limited: Hostile) -> None:  # noqa: F811
    """Found by the SQL fuzzer: a HUGEINT result was a 500 (neither encoder takes it)."""
    text = "SELECT 99999999999999999999999 AS big, -(2::HUGEINT ** 100)::HUGEINT AS low"
    response = http_calls.post(
        limited.url("/query"), json={"sql": text}, headers=auth(), timeout=10
    )
    assert response.status_code == 200, response.text[:300]
    assert json.loads(response.text)["rows"] == [{"big": 99999999999999999999999, "low": -(2**100)}]
    with Client(limited.node.url or "", token=TOKEN) as client:
        rows = client.sql(text).rows
    assert rows == [{"big": Decimal(99999999999999999999999), "low": Decimal(-(2**100))}]
