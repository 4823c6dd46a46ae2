"""Versioned key queries: a key's row at a past batch or time, and every version in a range.

The IQv2 names of Kafka Streams' versioned stores (KIP-960, KIP-968), read against a table's
retained history (``App.materialize(..., history=)``)::

    VersionedKeyQuery.with_key("AA").as_of(12)                  # at batch 12
    VersionedKeyQuery.with_key("AA").as_of(datetime(...))       # at the batch current then
    MultiVersionedKeyQuery.with_key("AA").from_time(a).to_time(b).with_ascending_timestamps()

**Versions.** A version of a key is a maximal run of batches during which the key's row was
the same: it starts at the batch that wrote that row (``valid_from``) and ends at the batch
that replaced or deleted it (``valid_to``, exclusive; ``None`` while current). A batch that
rewrote the row with an equal value (a complete-mode batch, an unchanged aggregate) does not
start a new version. Times are the commit times of those batches: the batch current at time
``t`` is the newest committed at or before ``t``.

**The history window.** A replica keeps the batches of the table's history window, from the
batch it was opened at. Validity intervals are clipped to that window: a version that was
already current at the oldest retained batch reports that batch as its ``valid_from`` (its
true start may be earlier). A ``VersionedKeyQuery`` of a batch or time before the window,
and a ``MultiVersionedKeyQuery`` whose whole range ends before it, fail with
``NOT_UP_TO_BOUND`` naming the oldest batch still readable; a range that reaches into the
window returns the versions the window holds.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from sparkiq.query.instant import instant_problem
from sparkiq.query.queries import Query, ResultOrder

__all__ = ["MultiVersionedKeyQuery", "VersionedKeyQuery", "VersionedRecord"]


@dataclass(frozen=True, slots=True)
class VersionedRecord:
    """One version of a key's row and its validity interval.

    ``value`` is the row (a dict, as a ``KeyQuery`` returns it). ``valid_from`` is the batch
    that wrote it (clipped to the history window, see the module docstring) and
    ``valid_to`` the batch that replaced or deleted it (``None``: still current);
    ``valid_from_time`` / ``valid_to_time`` are those batches' commit times as UTC datetimes
    (``None`` when ``valid_to`` is, or when the commit time is not known).
    """

    value: dict[str, Any]
    valid_from: int
    valid_to: int | None
    valid_from_time: dt.datetime | None
    valid_to_time: dt.datetime | None


@dataclass(frozen=True, slots=True)
class VersionedKeyQuery(Query):
    """The version of one key's row valid at a batch or a time, as a
    :class:`VersionedRecord`, or ``None`` when the key had no row then.

    Without :meth:`as_of`, the current version (or, when the request reads
    ``StateQueryRequest.as_of(...)``, the version valid at that batch).
    """

    key: Any
    as_of_batch: int | None = None
    as_of_time: dt.datetime | None = None

    single_key = True

    def __post_init__(self) -> None:
        _check_batch("as_of_batch", self.as_of_batch)
        _check_time("as_of_time", self.as_of_time)
        if self.as_of_batch is not None and self.as_of_time is not None:
            raise ValueError("a VersionedKeyQuery reads as of a batch or a time, not both")

    @staticmethod
    def with_key(key: Any) -> VersionedKeyQuery:
        return VersionedKeyQuery(key)

    def as_of(self, batch_or_time: int | dt.datetime) -> VersionedKeyQuery:
        """At batch ``batch_or_time`` (an int) or at the batch current at that time (a
        datetime; naive means local time, as PySpark shows timestamps)."""
        if isinstance(batch_or_time, dt.datetime):
            return replace(self, as_of_batch=None, as_of_time=batch_or_time)
        if isinstance(batch_or_time, bool) or not isinstance(batch_or_time, int):
            raise TypeError(
                "as_of() takes a batch id (int) or a datetime, got "
                f"{type(batch_or_time).__name__} {_shown(batch_or_time)}"
            )
        return replace(self, as_of_batch=batch_or_time, as_of_time=None)

    def routing_key(self) -> Any:
        return self.key


@dataclass(frozen=True, slots=True)
class MultiVersionedKeyQuery(Query):
    """Every version of one key whose validity overlaps the range, as a list of
    :class:`VersionedRecord` (empty when there is none).

    The range is ``[time_from, time_to]`` by commit time and ``[batch_from, batch_to]`` by
    batch id (inclusive; an unset bound is open; both kinds may be given). A version
    overlaps when it started at or before the range's end and ended after its start (or is
    current). Ordered by ``valid_from``: ascending by default, or as
    :meth:`with_descending_timestamps` says.
    """

    key: Any
    time_from: dt.datetime | None = None
    time_to: dt.datetime | None = None
    batch_from: int | None = None
    batch_to: int | None = None
    order: ResultOrder = ResultOrder.ANY

    single_key = True

    def __post_init__(self) -> None:
        _check_time("time_from", self.time_from)
        _check_time("time_to", self.time_to)
        _check_batch("batch_from", self.batch_from)
        _check_batch("batch_to", self.batch_to)
        if not isinstance(self.order, ResultOrder):
            raise TypeError(f"order must be a ResultOrder, got {_shown(self.order)}")
        if (
            self.time_from is not None
            and self.time_to is not None
            and self.time_from.timestamp() > self.time_to.timestamp()
        ):
            raise ValueError(
                f"time_from {self.time_from.isoformat()} is after time_to "
                f"{self.time_to.isoformat()}: the range is empty"
            )
        if (
            self.batch_from is not None
            and self.batch_to is not None
            and self.batch_from > self.batch_to
        ):
            raise ValueError(
                f"batch_from {self.batch_from} is after batch_to {self.batch_to}: the range "
                "is empty"
            )

    @staticmethod
    def with_key(key: Any) -> MultiVersionedKeyQuery:
        return MultiVersionedKeyQuery(key)

    def from_time(self, time_from: dt.datetime) -> MultiVersionedKeyQuery:
        """Versions still valid at or after ``time_from``."""
        return replace(self, time_from=time_from)

    def to_time(self, time_to: dt.datetime) -> MultiVersionedKeyQuery:
        """Versions that started at or before ``time_to``."""
        return replace(self, time_to=time_to)

    def from_batch(self, batch_from: int) -> MultiVersionedKeyQuery:
        """Versions still valid at or after batch ``batch_from``."""
        return replace(self, batch_from=batch_from)

    def to_batch(self, batch_to: int) -> MultiVersionedKeyQuery:
        """Versions that started at or before batch ``batch_to``."""
        return replace(self, batch_to=batch_to)

    def with_ascending_timestamps(self) -> MultiVersionedKeyQuery:
        return replace(self, order=ResultOrder.ASCENDING)

    def with_descending_timestamps(self) -> MultiVersionedKeyQuery:
        return replace(self, order=ResultOrder.DESCENDING)

    def routing_key(self) -> Any:
        return self.key


def _check_batch(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a batch id (an int >= 0), got {_shown(value)}")


def _check_time(name: str, value: object) -> None:
    """Times are datetimes (queries also arrive from the network)."""
    if value is not None and not isinstance(value, dt.datetime):
        raise TypeError(
            f"{name} must be a datetime.datetime or None, got {type(value).__name__} "
            f"{_shown(value)}"
        )
    problem = None if value is None else instant_problem(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
