"""What a caller asks for: a query on a store, which partitions, how fresh, and how strictly.

Build a request the IQv2 way::

    req = (StateQueryRequest.in_store("delays_by_carrier")
           .with_query(KeyQuery.with_key("AA"))
           .with_position_bound(PositionBound.unbounded()))

Every ``with_*`` returns a new request; requests are immutable and safe to share.

**Which batch.** A request that reads more than one partition of a table reads all of them at
one batch ``B`` of that table -- the newest every partition can serve, and no older than the
bound -- so its answer is a state the table really had. ``as_of(b)`` asks for batch ``b``
exactly; ``as_of_time(t)`` for the batch that was current at ``t`` (the newest committed at or
before ``t``). Past batches are readable while the table's history keeps them
(``App.materialize(..., history=)``). A single-key request reads the newest batch of its
partition unless it asks ``as_of``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from sparkiq.query.instant import instant_problem
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
        # Every field set through the slots: the value StateQueryRequest(store, query)
        # gives, built about three times faster (one per KeyQuery a caller sends).
        made: StateQueryRequest = _new(StateQueryRequest)
        _set_store(made, self.store)
        _set_query(made, query)
        _set_partitions(made, None)
        _set_require_active(made, False)
        _set_bound(made, _UNBOUNDED)
        _set_execution_info(made, False)
        _set_at_batch(made, None)
        _set_at_time(made, None)
        return made


#: The most partitions a request received from the network may name, and the bound of their
#: numbers (``0 .. MAX_PARTITIONS - 1``). A table has far fewer (an ``App`` table at most
#: 4096; an attached checkpoint as many as its ``spark.sql.shuffle.partitions``), and naming
#: none means all of them; a node answers every partition named with a frame of its own,
#: so a longer list would cost seconds before any check of the table (a list of 200,000 held
#: a node's event loop for 9.8 s). :func:`partition_list_problem` checks a parsed list.
MAX_PARTITIONS = 65536


def partition_list_problem(partitions: object) -> str | None:
    """What is wrong with ``partitions`` as a request's list of partition numbers, as
    parsed from the network (JSON or MessagePack), or None when it is one: at most
    :data:`MAX_PARTITIONS` ints from 0 to ``MAX_PARTITIONS - 1``, none twice. The length
    is checked first, so a huge list costs no more than its parse."""
    if not isinstance(partitions, list):
        return f"expected a list of partition numbers, got {type(partitions).__name__}"
    if len(partitions) > MAX_PARTITIONS:
        return (
            f"{len(partitions)} partitions named; a request names at most {MAX_PARTITIONS} "
            "(name none to ask for every partition)"
        )
    bad = [p for p in partitions if isinstance(p, bool) or not isinstance(p, int)]
    if bad:
        return f"partitions must be ints, got {sorted(map(repr, bad))[:5]}"
    outside = sorted(p for p in partitions if not 0 <= p < MAX_PARTITIONS)
    if outside:
        return f"partition numbers are 0 to {MAX_PARTITIONS - 1}, got {outside[:5]}"
    if len(set(partitions)) != len(partitions):
        twice = sorted(p for p, n in Counter(partitions).items() if n > 1)
        return f"partitions {twice[:5]} named more than once; name each partition once"
    return None


@dataclass(frozen=True, slots=True)
class StateQueryRequest:
    """A query addressed to a store, with partition selection and consistency options.

    ``partitions`` is ``None`` for "all partitions" (or, for a single-key query, the key's
    partition). ``require_active`` refuses answers from standby replicas. ``bound`` is the
    position each answering partition must have reached. ``at_batch`` / ``at_time`` are set
    by :meth:`as_of` / :meth:`as_of_time` (None: the newest consistent batch).
    """

    store: str
    query: Query
    partitions: frozenset[int] | None = None
    is_require_active: bool = False
    bound: PositionBound = _UNBOUNDED
    is_execution_info_enabled: bool = False
    at_batch: int | None = None
    at_time: dt.datetime | None = None

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

    def as_of(self, batch_id: int) -> StateQueryRequest:
        """Read every partition at batch ``batch_id`` (it must still be in the history)."""
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"as_of() takes a batch id (an int >= 0), got {batch_id!r}")
        return replace(self, at_batch=batch_id, at_time=None)

    def as_of_time(self, when: dt.datetime) -> StateQueryRequest:
        """Read every partition at the batch that was current at ``when`` (a datetime;
        naive means local time, as PySpark shows timestamps)."""
        if not isinstance(when, dt.datetime):
            raise TypeError(f"as_of_time() takes a datetime, got {type(when).__name__}")
        problem = instant_problem(when)
        if problem is not None:
            raise ValueError(f"as_of_time(): {problem}")
        return replace(self, at_time=when, at_batch=None)

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
            "as_of": self.at_batch if self.at_time is None else self.at_time.isoformat(),
        }


# InStore.with_query builds requests through the slots' descriptors (a frozen dataclass's
# __init__ sets each field with object.__setattr__, about three times slower).
_new = object.__new__
_FIELDS = (
    "store",
    "query",
    "partitions",
    "is_require_active",
    "bound",
    "is_execution_info_enabled",
    "at_batch",
    "at_time",
)
# with_query sets every field: a field added to the class must be added here too
assert {f.name for f in fields(StateQueryRequest)} == set(_FIELDS)
(
    _set_store,
    _set_query,
    _set_partitions,
    _set_require_active,
    _set_bound,
    _set_execution_info,
    _set_at_batch,
    _set_at_time,
) = (StateQueryRequest.__dict__[name].__set__ for name in _FIELDS)
