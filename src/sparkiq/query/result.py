"""Query results: one :class:`QueryResult` per partition, gathered in a :class:`StateQueryResult`.

Failures are values. A partition that cannot answer carries a :class:`FailureReason` and a
message saying what the caller can do; the other partitions of the same request still answer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from sparkiq.query.position import Position

__all__ = ["FailureReason", "QueryResult", "RowIterator", "StateQueryResult"]

R = TypeVar("R")


class FailureReason(enum.Enum):
    """Why a partition did not answer, and what a caller should do about it."""

    UNKNOWN_QUERY_TYPE = "UNKNOWN_QUERY_TYPE"
    """The store has no handler for this query type: register one, or query another store."""

    NOT_ACTIVE = "NOT_ACTIVE"
    """``require_active()`` was set and this replica is a standby: retry on the active node."""

    NOT_UP_TO_BOUND = "NOT_UP_TO_BOUND"
    """The replica has not reached the requested bound yet: retry later or on another replica."""

    NOT_PRESENT = "NOT_PRESENT"
    """The partition exists but is not hosted here: ask the node that hosts it."""

    DOES_NOT_EXIST = "DOES_NOT_EXIST"
    """The table has no such partition: check the partition numbers against its count."""

    STORE_EXCEPTION = "STORE_EXCEPTION"
    """The store failed while answering (I/O error, corrupted data): see the message."""


class RowIterator(Iterator[tuple[Any, dict[str, Any]]]):
    """A closeable iterator of ``(key, row)`` pairs, returned by range and window queries.

    It holds a store snapshot until it is exhausted or closed; use it as a context manager
    or call :meth:`close` when you stop early.
    """

    def __init__(self, items: Iterator[tuple[Any, dict[str, Any]]], on_close: Any = None) -> None:
        self._items = items
        self._on_close = on_close
        self._closed = False

    def __iter__(self) -> RowIterator:
        return self

    def __next__(self) -> tuple[Any, dict[str, Any]]:
        if self._closed:
            raise StopIteration
        try:
            return next(self._items)
        except StopIteration:
            self.close()
            raise

    def close(self) -> None:
        """Release the snapshot. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._on_close is not None:
                self._on_close()

    def __enter__(self) -> RowIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class QueryResult(Generic[R]):
    """The outcome of a query on one partition.

    On success ``result`` holds the answer (a row dict or ``None`` for a key query, a
    :class:`RowIterator` for range queries) and ``position`` the replica position it was
    served at. On failure ``failure_reason`` and ``failure_message`` say why.
    ``execution_info`` lists what each layer did, when the request enabled it.
    """

    result: R | None = None
    failure_reason: FailureReason | None = None
    failure_message: str | None = None
    position: Position = field(default_factory=Position.empty)
    execution_info: tuple[str, ...] = ()

    @staticmethod
    def for_result(
        result: R, position: Position, execution_info: tuple[str, ...] = ()
    ) -> QueryResult[R]:
        # Built through the slots (see _new below): one per key lookup answered.
        made: QueryResult[R] = _new(QueryResult)
        _set_result(made, result)
        _set_reason(made, None)
        _set_message(made, None)
        _set_position(made, position)
        _set_info(made, execution_info)
        return made

    @staticmethod
    def for_failure(
        reason: FailureReason, message: str, position: Position | None = None
    ) -> QueryResult[Any]:
        return QueryResult(
            failure_reason=reason,
            failure_message=message,
            position=position if position is not None else Position.empty(),
        )

    @property
    def is_success(self) -> bool:
        return self.failure_reason is None

    @property
    def is_failure(self) -> bool:
        return self.failure_reason is not None

    def with_execution_info(self, *lines: str) -> QueryResult[R]:
        return QueryResult(
            self.result,
            self.failure_reason,
            self.failure_message,
            self.position,
            self.execution_info + lines,
        )

    def __repr__(self) -> str:
        if self.failure_reason is not None:
            return (
                f"QueryResult(failure={self.failure_reason.name}, message={self.failure_message!r})"
            )
        return f"QueryResult(result={self.result!r}, position={self.position!r})"


# A frozen dataclass's __init__ sets each field with object.__setattr__; the slots' own
# descriptors set them about three times faster. The constructors on the key lookup path
# (built once or more per lookup) use them, setting every field, so the value is the same.
_new = object.__new__
_set_result, _set_reason, _set_message, _set_position, _set_info = (
    QueryResult.__dict__[name].__set__
    for name in ("result", "failure_reason", "failure_message", "position", "execution_info")
)


@dataclass(frozen=True, slots=True)
class StateQueryResult(Generic[R]):
    """Per-partition results of one request, and the merged position of the successful ones."""

    partition_results: Mapping[int, QueryResult[R]]

    def __init__(self, partition_results: Mapping[int, QueryResult[R]]) -> None:
        object.__setattr__(
            self, "partition_results", MappingProxyType(dict(sorted(partition_results.items())))
        )

    @classmethod
    def of_one(cls, partition: int, result: QueryResult[R]) -> StateQueryResult[R]:
        """The result of a request that read one partition (a key query's): the same value
        as ``StateQueryResult({partition: result})``, without sorting and copying a mapping
        built for the purpose."""
        made = _new(cls)
        _set_partition_results(made, MappingProxyType({partition: result}))
        return made

    @property
    def position(self) -> Position:
        """Merge of the positions of every successful partition result."""
        merged = Position.empty()
        for result in self.partition_results.values():
            if result.is_success:
                merged = merged.merge(result.position)
        return merged

    def only_partition_result(self) -> QueryResult[R]:
        """The single partition's result; raises if the request touched several partitions.

        A key query touches only its key's partition, so this is how its answer is read.
        """
        if len(self.partition_results) != 1:
            raise ValueError(
                f"the result has {len(self.partition_results)} partition results "
                f"(partitions {sorted(self.partition_results)}); iterate partition_results instead"
            )
        return next(iter(self.partition_results.values()))

    @property
    def failures(self) -> dict[int, QueryResult[R]]:
        return {p: r for p, r in self.partition_results.items() if r.is_failure}

    def __repr__(self) -> str:
        return f"StateQueryResult({dict(self.partition_results)!r})"


_set_partition_results = StateQueryResult.__dict__["partition_results"].__set__
