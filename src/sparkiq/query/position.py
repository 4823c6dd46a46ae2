"""Positions: what a replica has applied, and bounds a query asks to be served at.

A :class:`Position` maps *components* to ``{partition: offset}``. sparkiq uses two kinds of
component:

* the table's own name, whose offsets are micro-batch ids. Batch ids are a **table-wide
  clock**: every partition's replica advances to batch ``b`` when it applies the commit of
  ``b``, whether or not that batch changed the partition.
* ``kafka:<topic>`` for Kafka sources, whose offsets are the source's end offsets of the last
  applied batch, per topic partition.

Positions only move forward; :meth:`Position.merge` takes the maximum per entry. A position's
string token (:meth:`Position.to_token`) is what HTTP clients carry between requests; it
round-trips exactly.

**Read-your-writes for producers.** A Kafka producer learns where its record went from the
broker's acknowledgement (topic, partition, offset); :meth:`PositionBound.after` turns
acknowledgements into a bound that a table admits once it has applied those records, that
is, once its ``kafka:<topic>`` end offset for the partition is beyond the record's offset.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["KAFKA_PREFIX", "Position", "PositionBound", "kafka_topics"]

_TOKEN_PREFIX = "p1."
_MARK = "\x00offset\x00"  # stands for the varying offset in tokens_varying's JSON

#: The component prefix of a Kafka topic's offsets: ``kafka:<topic>``.
KAFKA_PREFIX = "kafka:"


def kafka_topics(position: Position) -> list[str]:
    """The Kafka topics a position names, sorted."""
    return sorted(c[len(KAFKA_PREFIX) :] for c in position.components if c.startswith(KAFKA_PREFIX))


def _freeze(positions: Mapping[str, Mapping[int, int]]) -> Mapping[str, Mapping[int, int]]:
    frozen: dict[str, Mapping[int, int]] = {}
    for component, offsets in positions.items():
        if not isinstance(component, str) or not component:
            raise ValueError(f"position component must be a non-empty str, got {component!r}")
        inner: dict[int, int] = {}
        for partition, offset in offsets.items():
            p, o = _as_int(partition, "partition"), _as_int(offset, "offset")
            inner[p] = o
        frozen[component] = MappingProxyType(inner)
    return MappingProxyType(frozen)


def _covers(seen: Mapping[int, int], wanted: Mapping[int, int]) -> bool:
    """Whether every partition in ``wanted`` is in ``seen`` with an offset at least as high."""
    for partition, offset in wanted.items():
        have = seen.get(partition)
        if have is None or have < offset:
            return False
    return True


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"position {what} must be an int, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"position {what} must be an int, got {value!r}")


@dataclass(frozen=True, slots=True)
class Position:
    """An immutable vector of ``component -> partition -> offset``.

    Build one with :meth:`from_map` or :meth:`empty`; combine with :meth:`merge`.
    """

    _map: Mapping[str, Mapping[int, int]] = field(default_factory=lambda: MappingProxyType({}))
    # to_token's answer, made on first use: a partition's position answers every read until
    # its next batch, and each REST answer carries its token (not part of the value)
    _token: str | None = field(default=None, init=False, repr=False, compare=False)

    @staticmethod
    def empty() -> Position:
        return _EMPTY

    @staticmethod
    def from_map(positions: Mapping[str, Mapping[int, int]]) -> Position:
        """A position from ``{component: {partition: offset}}`` (the map is copied)."""
        return Position(_freeze(positions))

    @staticmethod
    def of_kafka_offsets(topic: str, offsets: Mapping[int, int]) -> Position:
        """The position of a reader of ``topic`` that has read every partition up to the
        given *end* offsets (the next offset it would read, as Spark's offset log and Kafka
        consumer commits count): component ``kafka:<topic>``. For a record a producer sent,
        whose offset is the record's own, use :meth:`PositionBound.after`."""
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"a Kafka topic must be a non-empty str, got {topic!r}")
        return Position.from_map({KAFKA_PREFIX + topic: offsets})

    def to_map(self) -> dict[str, dict[int, int]]:
        """A fresh, mutable copy of the position's map."""
        return {c: dict(offsets) for c, offsets in self._map.items()}

    @property
    def components(self) -> frozenset[str]:
        return frozenset(self._map)

    def partition_offsets(self, component: str) -> Mapping[int, int]:
        """Offsets of one component (empty when the component is absent)."""
        return self._map.get(component, _EMPTY_OFFSETS)

    def is_empty(self) -> bool:
        return not self._map

    def merge(self, other: Position) -> Position:
        """The entry-wise maximum of two positions (commutative, associative, idempotent)."""
        if not other._map:
            return self
        if not self._map:
            return other
        merged = self.to_map()
        for component, offsets in other._map.items():
            mine = merged.setdefault(component, {})
            for partition, offset in offsets.items():
                if offset > mine.get(partition, offset - 1):
                    mine[partition] = offset
        return Position(_freeze(merged))

    def dominates(self, other: Position) -> bool:
        """True when every entry of ``other`` is present here with an offset at least as high."""
        for component, offsets in other._map.items():
            mine = self._map.get(component)
            if mine is None or not _covers(mine, offsets):
                return False
        return True

    def to_token(self) -> str:
        """A URL-safe string that :meth:`from_token` turns back into an equal position."""
        token = self._token
        if token is None:
            doc = {
                c: {str(p): o for p, o in sorted(offs.items())}
                for c, offs in sorted(self._map.items())
            }
            raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
            token = _TOKEN_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
            object.__setattr__(self, "_token", token)  # a cache: the value is unchanged
        return token

    @staticmethod
    def tokens_varying(
        base: Mapping[str, Mapping[int, int]], component: str, partition: int
    ) -> Callable[[int], str]:
        """``f(n)`` = the token of ``base`` plus ``{component: {partition: n}}``, the same
        string :meth:`to_token` gives, for many ``n``: the JSON is laid out once, so each
        token costs one format and one base64 (a push query's changes of one batch differ
        only in how far into the batch they are)."""
        doc = {c: {str(p): o for p, o in offs.items()} for c, offs in _freeze(base).items()}
        doc[component] = {str(partition): _MARK}  # type: ignore[dict-item]
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
        head, tail = text.split(json.dumps(_MARK))
        encode = base64.urlsafe_b64encode

        def token(n: int) -> str:
            raw = f"{head}{int(n)}{tail}".encode()
            return _TOKEN_PREFIX + encode(raw).rstrip(b"=").decode()

        return token

    @staticmethod
    def from_token(token: str) -> Position:
        """Parse a token made by :meth:`to_token`; raises ValueError naming what is wrong."""
        if not isinstance(token, str) or not token.startswith(_TOKEN_PREFIX):
            raise ValueError(
                f"not a sparkiq position token: {token!r:.80}; tokens start with {_TOKEN_PREFIX!r}"
            )
        body = token[len(_TOKEN_PREFIX) :]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"corrupted position token {token!r:.80}: {exc}") from None
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            raise ValueError(f"corrupted position token {token!r:.80}: not a position map")
        return Position.from_map(doc)

    def __repr__(self) -> str:
        return f"Position({self.to_map()!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self.to_map() == other.to_map()

    def __hash__(self) -> int:
        return hash(self.to_token())


_EMPTY_OFFSETS: Mapping[int, int] = MappingProxyType({})
_EMPTY = Position()


@dataclass(frozen=True, slots=True)
class PositionBound:
    """How fresh a partition's answer must be.

    ``unbounded()`` accepts any replica state. ``at(position)`` accepts a partition only if
    its replica has reached ``position``; otherwise that partition fails with
    ``FailureReason.NOT_UP_TO_BOUND``. See :meth:`admits` for the exact rule.
    """

    position: Position | None = None

    @staticmethod
    def unbounded() -> PositionBound:
        return _UNBOUNDED

    @staticmethod
    def at(position: Position) -> PositionBound:
        if not isinstance(position, Position):
            raise TypeError(f"PositionBound.at() takes a Position, got {type(position).__name__}")
        return PositionBound(position)

    @staticmethod
    def after(*acks: Any) -> PositionBound:
        """A bound admitted once the records a producer sent have been applied.

        Each argument is one acknowledged record: a confluent-kafka ``Message`` (from a
        delivery callback), a kafka-python or aiokafka ``RecordMetadata`` (what a send's
        future returns), or a ``(topic, partition, offset)`` tuple; ``after("orders", 3,
        1041)`` names one record directly. The bound asks for each record's partition to be
        read past its offset (end offset ``offset + 1``); records of one partition keep the
        highest. A table admits it once the batch that read those records is applied; a
        bound naming only topics the table does not read is refused, naming the topics it
        does read.
        """
        if len(acks) == 3 and isinstance(acks[0], str):
            acks = (tuple(acks),)
        if not acks:
            raise ValueError(
                "PositionBound.after() needs at least one acknowledged record: a delivered "
                "Message, a RecordMetadata or a (topic, partition, offset) tuple"
            )
        ends: dict[str, dict[int, int]] = {}
        for ack in acks:
            topic, partition, offset = _acknowledged(ack)
            wanted = ends.setdefault(KAFKA_PREFIX + topic, {})
            wanted[partition] = max(wanted.get(partition, 0), offset + 1)
        return PositionBound(Position.from_map(ends))

    @property
    def is_unbounded(self) -> bool:
        return self.position is None

    @property
    def kafka_only(self) -> bool:
        """Whether the bound names Kafka offsets and nothing else (what :meth:`after`
        makes): such a bound must name a topic the table reads."""
        components = () if self.position is None else self.position.components
        return bool(components) and all(c.startswith(KAFKA_PREFIX) for c in components)

    def merge(self, other: PositionBound) -> PositionBound:
        """A bound asking for what both ask for (unbounded merges to the other)."""
        if other.position is None:
            return self
        if self.position is None:
            return other
        return PositionBound(self.position.merge(other.position))

    def admits(self, table: str, seen: Position) -> bool:
        """Whether a replica of ``table`` that has applied ``seen`` satisfies this bound.

        - For the table's own component, offsets are batch ids of a table-wide clock, so the
          replica must have applied at least the highest batch id the bound names, whichever
          partition it was named for. This is what makes a token from one key's answer give
          monotonic reads and read-your-writes on every other key of the table.
        - For any other component the replica tracks (e.g. ``kafka:<topic>``), every
          partition the bound names must be present in ``seen`` with an offset at least as
          high.
        - Components the replica does not track at all (another table's clock, a source this
          table does not read) do not constrain it.
        """
        if self.position is None:
            return True
        bound_map = self.position._map
        for component, offsets in bound_map.items():
            if not offsets:
                continue
            seen_offsets = seen._map.get(component)
            if component == table:
                if not seen_offsets or max(seen_offsets.values()) < max(offsets.values()):
                    return False
                continue
            if seen_offsets is not None and not _covers(seen_offsets, offsets):
                return False
        return True

    def __repr__(self) -> str:
        return (
            "PositionBound.unbounded()"
            if self.position is None
            else f"PositionBound.at({self.position!r})"
        )


_UNBOUNDED = PositionBound()


def _acknowledged(ack: Any) -> tuple[str, int, int]:
    """(topic, partition, offset) of one acknowledged record, read the way each client
    exposes it: methods (confluent-kafka's ``Message``), attributes (kafka-python's and
    aiokafka's ``RecordMetadata``) or a plain tuple."""
    if isinstance(ack, tuple) and len(ack) == 3:
        topic, partition, offset = ack
    elif all(hasattr(ack, name) for name in ("topic", "partition", "offset")):
        error = getattr(ack, "error", None)
        if callable(error) and error() is not None:
            raise ValueError(f"the record was not delivered ({error()}): no offset to wait for")
        topic, partition, offset = (
            value() if callable(value) else value
            for value in (ack.topic, ack.partition, ack.offset)
        )
    else:
        raise TypeError(
            "PositionBound.after() takes acknowledged records (a delivered Message, a "
            f"RecordMetadata or a (topic, partition, offset) tuple), got {type(ack).__name__}"
        )
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"an acknowledged record needs its topic, got {topic!r}")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"an acknowledged record needs its partition (>= 0), got {partition!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(
            f"record of {topic!r} partition {partition} has no offset ({offset!r}): the broker "
            "acknowledges offsets only with acks=1 or acks=all, after delivery"
        )
    return topic, partition, offset
