"""Requests and results are immutable values with IQv2's named constructors."""

from __future__ import annotations

import dataclasses

import pytest

from sparkiq import (
    FailureReason,
    KeyQuery,
    Position,
    PositionBound,
    QueryResult,
    RangeQuery,
    ResultOrder,
    StateQueryRequest,
    StateQueryResult,
)


def test_builder_returns_new_requests() -> None:
    base = StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("a"))
    narrowed = base.with_partitions({1, 2}).require_active().enable_execution_info()
    assert base.partitions is None and not base.is_require_active
    assert narrowed.partitions == frozenset({1, 2})
    assert narrowed.is_require_active and narrowed.is_execution_info_enabled
    assert narrowed.with_all_partitions().is_all_partitions
    bound = PositionBound.at(Position.from_map({"t": {0: 3}}))
    assert base.with_position_bound(bound).bound == bound
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.store = "u"  # type: ignore[misc]


def test_builder_rejects_wrong_types_with_advice() -> None:
    with pytest.raises(TypeError, match="KeyQuery"):
        StateQueryRequest.in_store("t").with_query("a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        StateQueryRequest.in_store("")
    with pytest.raises(ValueError, match="ints"):
        StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(1)).with_partitions(["0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"PositionBound\.at"):
        StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(1)).with_position_bound(
            Position.empty()  # type: ignore[arg-type]
        )


def test_range_query_constructors() -> None:
    assert RangeQuery.with_range(1, 5) == RangeQuery(1, 5, True, True)
    assert RangeQuery.with_lower_bound(1) == RangeQuery(1, None, True, False)
    assert RangeQuery.with_upper_bound(5) == RangeQuery(None, 5, False, True)
    assert RangeQuery.with_no_bounds() == RangeQuery()
    descending = RangeQuery.with_no_bounds().with_result_order(ResultOrder.DESCENDING)
    assert descending.order is ResultOrder.DESCENDING
    # A None bound given explicitly is a bound on the null key, not an open bound.
    assert RangeQuery.with_range(None, None).has_lower


def test_state_query_result_merges_successful_positions_only() -> None:
    ok = QueryResult.for_result({"a": 1}, Position.from_map({"t": {0: 4}}))
    ok2 = QueryResult.for_result(None, Position.from_map({"t": {1: 6}}))
    failed = QueryResult.for_failure(
        FailureReason.NOT_UP_TO_BOUND, "behind", Position.from_map({"t": {2: 1}})
    )
    result = StateQueryResult({1: ok2, 0: ok, 2: failed})
    assert list(result.partition_results) == [0, 1, 2]
    assert result.position == Position.from_map({"t": {0: 4, 1: 6}})
    assert result.failures == {2: failed}
    assert failed.is_failure and not failed.is_success and failed.result is None
    with pytest.raises(ValueError, match="3 partition results"):
        result.only_partition_result()
    assert StateQueryResult({0: ok}).only_partition_result().result == {"a": 1}
