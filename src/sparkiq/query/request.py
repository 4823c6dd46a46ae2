"""What a caller asks for: a query on a store, which partitions, how fresh, and how strictly.

Build a request the IQv2 way::

    req = (StateQueryRequest.in_store("delays_by_carrier")
           .with_query(KeyQuery.with_key("AA"))
           .with_position_bound(PositionBound.unbounded()))

Every ``with_*`` returns a new request; requests are immutable and safe to share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sparkiq.query.position import PositionBound
from sparkiq.query.queries import Query

_UNBOUNDED = PositionBound.unbounded()

__all__ = ["InStore", "StateQueryRequest"]


@dataclass(frozen=True, slots=True)
class InStore:
    """First step of building a request: the store is chosen, the query is not yet."""

    store: str

    def with_query(self, query: Query) -> StateQueryRequest:
        if not isinstance(query, Query):
            raise TypeError(
                f"with_query() takes a sparkiq Query (KeyQuery, RangeQuery, ...), "
                f"got {type(query).__name__}"
            )
        return StateQueryRequest(self.store, query)


@dataclass(frozen=True, slots=True)
class StateQueryRequest:
    """A query addressed to a store, with partition selection and consistency options.

    ``partitions`` is ``None`` for "all partitions" (or, for a single-key query, the key's
    partition). ``require_active`` refuses answers from standby replicas. ``bound`` is the
    position each answering partition must have reached.
    """

    store: str
    query: Query
    partitions: frozenset[int] | None = None
    is_require_active: bool = False
    bound: PositionBound = _UNBOUNDED
    is_execution_info_enabled: bool = False

    @staticmethod
    def in_store(name: str) -> InStore:
        if not isinstance(name, str) or not name:
            raise ValueError(f"store name must be a non-empty str, got {name!r}")
        return InStore(name)

    def with_partitions(self, partitions: Iterable[int]) -> StateQueryRequest:
        chosen = frozenset(partitions)
        bad = [p for p in chosen if isinstance(p, bool) or not isinstance(p, int)]
        if bad:
            raise ValueError(f"partitions must be ints, got {sorted(map(repr, bad))}")
        return replace(self, partitions=chosen)

    def with_all_partitions(self) -> StateQueryRequest:
        return replace(self, partitions=None)

    def require_active(self) -> StateQueryRequest:
        return replace(self, is_require_active=True)

    def with_position_bound(self, bound: PositionBound) -> StateQueryRequest:
        if not isinstance(bound, PositionBound):
            raise TypeError(
                f"with_position_bound() takes a PositionBound, got {type(bound).__name__}; "
                "use PositionBound.at(position) or PositionBound.unbounded()"
            )
        return replace(self, bound=bound)

    def enable_execution_info(self) -> StateQueryRequest:
        return replace(self, is_execution_info_enabled=True)

    @property
    def is_all_partitions(self) -> bool:
        return self.partitions is None

    def describe(self) -> dict[str, Any]:
        """A plain summary, for logs and execution info."""
        return {
            "store": self.store,
            "query": type(self.query).__name__,
            "partitions": sorted(self.partitions) if self.partitions is not None else "all",
            "require_active": self.is_require_active,
            "bound": repr(self.bound),
        }
