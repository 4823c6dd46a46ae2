"""Bounds in a source's offsets: a producer's Kafka acknowledgement as a batch of the table.

A producer that wrote a record knows its topic, partition and offset
(:meth:`~sparkiq.query.position.PositionBound.after`); a table knows batches. Every commit
record carries the end offsets its batch read (``kafka:<topic>`` components), and those only
grow with the batch id, so the first batch whose offsets reach past the record is the oldest
batch that has applied it. :class:`SourceBounds` finds that batch and adds it to the bound as
the table's own clock component: from there every read path (pinning a batch, routing to
another node, a replica catching up) works as it does for a bound in batch ids.

It looks first at the commits the node's replicas have seen (kept in memory by
:class:`~sparkiq.changelog.replica.TableReplica`), and reads the changelog's newest commit
record only for a record newer than those. A record no committed batch has read yet is waited
for, a bounded time (the writer's next micro-batch usually brings it), then reported behind:
which topic partition, how far it has been read, how many records short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sparkiq.errors import ChangelogError, InvalidQueryError
from sparkiq.query.position import KAFKA_PREFIX, Position, PositionBound, kafka_topics
from sparkiq.serving.hosting import Hosting

__all__ = ["SOURCE_WAIT", "SourceBounds", "Unreached"]

#: How long a request waits for the writer to commit a batch that read its producer's
#: records before answering ``NOT_UP_TO_BOUND``: a few micro-batches at the usual triggers.
SOURCE_WAIT = 10.0

# How often a waiting request looks again at what the replicas have seen.
_RECHECK = 0.05


@dataclass(frozen=True, slots=True)
class Unreached:
    """No committed batch of the table has read the records the bound asks for (yet)."""

    message: str


class SourceBounds:
    """Turns the ``kafka:`` components of bounds into batches of the tables that read them."""

    def __init__(self, hosting: Hosting) -> None:
        self._hosting = hosting

    def resolve(self, table: str, bound: PositionBound, wait: float) -> PositionBound | Unreached:
        """``bound`` with the first batch of ``table`` that read every Kafka record it asks
        for, waiting up to ``wait`` seconds for the writer to commit one. Components the
        table does not read are left as they are (they do not constrain it); a bound made
        of Kafka offsets only must name a topic the table reads
        (:class:`~sparkiq.errors.InvalidQueryError` otherwise, naming those it does)."""
        position = bound.position
        if position is None or not kafka_topics(position):
            return bound
        deadline = time.monotonic() + wait
        while True:
            newest = self._newest(table)
            if newest is not None:
                wanted = self._wanted(table, bound, newest[1])
                if wanted is None:
                    return bound  # it names no topic this table reads (a merged token)
                batch = self._first_covering(table, wanted, newest)
                if batch is not None:
                    return bound.merge(PositionBound.at(Position.from_map({table: {0: batch}})))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Unreached(self._behind(table, bound, newest, wait))
            self._hosting.wait_for_commit(table, min(_RECHECK, remaining))

    def covered(self, table: str, bound: PositionBound) -> bool:
        """False only when the commits this node's replicas have seen show that ``table``
        has not read every Kafka record ``bound`` asks for yet; True when they show it has,
        and when they cannot tell (no commit seen: :meth:`resolve` reads the changelog).
        Memory only: the server asks it on its event loop while a request waits."""
        position = bound.position
        if position is None or not kafka_topics(position):
            return True
        recent = self._hosting.replica(table).recent_sources
        if not recent:
            return True
        wanted = self._wanted(table, bound, recent[-1][1], refuse=False)
        return wanted is None or recent[-1][1].dominates(wanted)

    # -- which batch -------------------------------------------------------------------------

    def _newest(self, table: str) -> tuple[int, Position] | None:
        """The newest committed batch and the source offsets it read: from the replicas'
        memory, or from the changelog's head when that is newer (None: nothing committed)."""
        replica = self._hosting.replica(table)
        recent = replica.recent_sources
        seen = recent[-1] if recent else None
        head = self._hosting.committed_head(table)
        if head is not None and head >= 0 and (seen is None or head > seen[0]):
            try:
                record = replica.source.read_commit(head)
            except (OSError, ChangelogError):  # a storage fault: the replicas' memory
                return seen
            if record is not None:
                return head, Position.from_map(record.position)
        return seen

    def _first_covering(
        self, table: str, wanted: Position, newest: tuple[int, Position]
    ) -> int | None:
        """The oldest batch known to have read ``wanted``: offsets grow with batch ids, so
        a binary search over the remembered commits finds it (the oldest remembered one when
        it already had; None when not even the newest has)."""
        if not newest[1].dominates(wanted):
            return None
        recent = list(self._hosting.replica(table).recent_sources)
        if not recent or recent[-1][0] < newest[0] or not recent[-1][1].dominates(wanted):
            return newest[0]
        low, high = 0, len(recent) - 1
        while low < high:
            middle = (low + high) // 2
            if recent[middle][1].dominates(wanted):
                high = middle
            else:
                low = middle + 1
        return recent[low][0]

    @staticmethod
    def _wanted(
        table: str, bound: PositionBound, read: Position, *, refuse: bool = True
    ) -> Position | None:
        """The bound's Kafka components for the topics ``table`` reads (None: it reads none
        of them). A bound made of Kafka offsets only that names none of them is a mistake
        worth saying (``refuse``): the producer is waiting on the wrong table."""
        assert bound.position is not None
        reads = set(kafka_topics(read))
        asked = kafka_topics(bound.position)
        kept = {
            KAFKA_PREFIX + t: bound.position.partition_offsets(KAFKA_PREFIX + t)
            for t in asked
            if t in reads
        }
        if kept:
            return Position.from_map(kept)
        if refuse and bound.kafka_only:
            names = ", ".join(repr(t) for t in asked)
            read_names = ", ".join(repr(t) for t in sorted(reads))
            raise InvalidQueryError(
                f"the bound waits for records of Kafka topic {names}, which table {table!r} "
                + (
                    f"does not read: it reads {read_names}; bound a read of a table built "
                    "from that topic"
                    if reads
                    else "does not read: it reads no Kafka topic"
                ),
                store=table,
            )
        return None

    def _behind(
        self, table: str, bound: PositionBound, newest: tuple[int, Position] | None, wait: float
    ) -> str:
        """Why the bound is not reached: each asked partition, how far it has been read."""
        if newest is None:
            return (
                f"table {table!r} has no committed batch yet, so none has read the records "
                f"the bound asks for (waited {wait:g} s): retry once the writer has committed"
            )
        batch, read = newest
        assert bound.position is not None
        short = []
        for topic in sorted(set(kafka_topics(bound.position)) & set(kafka_topics(read))):
            have = read.partition_offsets(KAFKA_PREFIX + topic)
            asked = bound.position.partition_offsets(KAFKA_PREFIX + topic)
            for partition, end in sorted(asked.items()):
                got = have.get(partition)
                if got is None:
                    short.append(f"partition {partition} of topic {topic!r} was not read yet")
                elif got < end:
                    short.append(
                        f"partition {partition} of topic {topic!r} is read up to offset {got}, "
                        f"the bound waits for offset {end - 1} ({end - got} records behind)"
                    )
        return (
            f"the newest committed batch of {table!r} ({batch}) has not read the records the "
            f"bound asks for: {'; '.join(short)} (waited {wait:g} s for the writer): retry "
            "later, or check that the pipeline is running"
        )
