"""How far a followed topic's table is behind the topic: :class:`TopicLag`.

Per partition of the topic:

- ``applied``: the next offset after what the table applied (the least advanced hosted
  partition of the table: the ``kafka:<topic>`` offsets of its replicas' positions);
- ``end``: the partition's end offset as the follower's consumer saw it on its last fetch
  (librdkafka's cached high watermark, fresh to the fetch: no broker request is made to
  show it; a record of a transaction still open counts until the transaction ends);
- ``lag``: ``end - applied`` records (None while either is unknown);
- ``seconds_behind``: 0 when the table has applied everything ``end`` counts, else the
  seconds since the follower last had (when it last was current: an upper bound on how long
  the oldest record not applied has been waiting, to within the follower's poll interval).

Per topic: the records read since the follower opened, and of them the ``malformed`` ones
(skipped) and the ``misplaced`` ones (stored in their key's partition, not the record's:
:mod:`sparkiq.topics.source`).

These are what ``status.json`` (``"topics"``), ``GET /stats``, ``/metrics``
(``sparkiq_topic_*``), the console and ``sparkiq status`` show of a node's followed topics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkiq.topics.source import TopicSource

__all__ = ["TopicLag", "TopicPartitionLag", "topic_lag", "topic_lags", "topic_lines"]


@dataclass(frozen=True, slots=True)
class TopicPartitionLag:
    """One partition of a followed topic (see the module docstring)."""

    partition: int
    applied: int | None
    end: int | None
    seconds_behind: float | None

    @property
    def lag(self) -> int | None:
        if self.applied is None or self.end is None:
            return None
        return max(0, self.end - self.applied)


@dataclass(frozen=True, slots=True)
class TopicLag:
    """A followed topic served as ``table``: its partitions' lag and its record counts."""

    table: str
    topic: str
    records: int
    malformed: int
    misplaced: int
    partitions: tuple[TopicPartitionLag, ...]

    @property
    def lag(self) -> int | None:
        """The records not applied yet, over the partitions whose lag is known."""
        known = [p.lag for p in self.partitions if p.lag is not None]
        return sum(known) if known else None

    @property
    def seconds_behind(self) -> float | None:
        """The most seconds behind of a partition (None: unknown on every one)."""
        known = [p.seconds_behind for p in self.partitions if p.seconds_behind is not None]
        return max(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``status.json``'s and ``/stats``' ``"topics"``)."""
        return {
            "table": self.table,
            "topic": self.topic,
            "records": self.records,
            "malformed": self.malformed,
            "misplaced": self.misplaced,
            "lag": self.lag,
            "seconds_behind": self.seconds_behind,
            "partitions": [
                {
                    "partition": p.partition,
                    "applied": p.applied,
                    "end": p.end,
                    "lag": p.lag,
                    "seconds_behind": p.seconds_behind,
                }
                for p in self.partitions
            ],
        }


def topic_lag(source: TopicSource, applied: Mapping[int, int] | None, now: float) -> TopicLag:
    """The lag of ``source``'s table, whose hosted partitions applied ``applied`` (the
    topic's ``{partition: next offset}``; None or a partition absent: not known here).
    Never blocks."""
    ends = source.high_watermarks()
    current = source.caught_up_at()
    applied = applied or {}
    partitions = []
    for partition in sorted(current):
        done, end = applied.get(partition), ends.get(partition)
        if done is None or end is None:
            behind = None
        elif done >= end:
            behind = 0.0
        else:
            behind = max(0.0, now - current[partition])
        partitions.append(TopicPartitionLag(partition, done, end, behind))
    return TopicLag(
        source.table,
        source.topic,
        source.records,
        source.malformed,
        source.misplaced,
        tuple(partitions),
    )


def topic_lags(
    sources: Iterable[TopicSource],
    applied: Mapping[tuple[str, str], Mapping[int, int]],
    now: float,
) -> list[TopicLag]:
    """:func:`topic_lag` of every source, with ``applied`` by ``(table, topic)``."""
    return [topic_lag(s, applied.get((s.table, s.topic)), now) for s in sources]


def topic_lines(docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The text ``sparkiq status`` shows of a node's followed topics (their JSON form)."""
    if not docs:
        return []
    lines = ["followed topics (end offsets as the follower last fetched them)"]
    for doc in docs:
        behind = doc.get("seconds_behind")
        shown = "unknown" if behind is None else f"{behind:.1f} s"
        lines.append(
            f"{doc['table']} <- topic {doc['topic']!r}: lag {_cell(doc.get('lag'))} records, "
            f"{shown} behind; {doc.get('records', 0)} records read, "
            f"{doc.get('malformed', 0)} malformed, {doc.get('misplaced', 0)} misplaced"
        )
        lines.append(f"  {'partition':>9} {'applied':>12} {'end':>12} {'lag':>10} {'behind':>9}")
        for p in doc.get("partitions", []):
            seconds = p.get("seconds_behind")
            lines.append(
                f"  {p['partition']:>9} {_cell(p.get('applied')):>12} {_cell(p.get('end')):>12} "
                f"{_cell(p.get('lag')):>10} {'-' if seconds is None else f'{seconds:.1f} s':>9}"
            )
    return lines


def _cell(value: object) -> str:
    return "-" if value is None else str(value)
