"""A Kafka topic as a table's changelog: :class:`TopicSource`, following a :class:`TopicSpec`.

A followed topic is a :class:`~sparkiq.changelog.source.ChangelogSource` like a sparkiq
changelog or a Spark checkpoint, so replicas, routing, SQL, REST, Postgres and push serve it
without knowing where its rows come from.

Reading
    One consumer per followed topic (confluent-kafka, ``isolation.level=read_committed``: a
    transactional publisher's batch is seen whole or not at all). It *assigns* every
    partition from the beginning and never commits offsets or joins a consumer group:
    where it is lives in the table's position, and a follower opened again restores from
    the topic (a compacted topic holds the last record of every key).

Batches
    What one read of the consumer returns (up to ``batch_records`` records) becomes one
    committed batch, so memory holds a bounded chunk, never the topic. Batch ids are this
    follower's own: consecutive from 0 in the order it read the records, and different on
    another follower or after a restart. What is comparable across followers is the
    position: every commit record carries ``kafka:<topic>`` -> ``{partition: end offset}``
    (the next offset to read, as a Spark Kafka source's offsets), so a producer's
    :meth:`~sparkiq.query.position.PositionBound.after` bound is met once the batch that read
    its record is applied. The newest ``retain_batches`` batches stay in memory for the
    replicas and push queries that have not taken them yet; an older one is gone (a replica
    that needs it reports an error: follow the topic again).

Placement
    Table partitions are the topic's partitions. A row is stored in the partition Kafka's
    default partitioner gives its key (:mod:`sparkiq.topics.keys`), which is where a key
    lookup looks: the partition the record came from whenever its producer partitioned by
    murmur2 over the same key bytes. A record read from another partition (a producer with
    another partitioner, or keys spelled differently) is still stored where lookups find it,
    and counted as ``misplaced`` (logged once).

Malformed records are skipped, counted (``malformed``) and logged naming the topic,
partition and offset; their offsets still count as read, so a bound on them is met.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.manifest import TableManifest
from sparkiq.changelog.segment import SegmentInfo
from sparkiq.changelog.snapshot import SnapshotInfo
from sparkiq.errors import ChangelogError, ConfigError, CorruptSegmentError
from sparkiq.query.position import KAFKA_PREFIX
from sparkiq.schema.codec import KeyCodec
from sparkiq.topics.avrovalues import avro_columns
from sparkiq.topics.consumer import confluent, new_consumer, partition_count, read_published
from sparkiq.topics.jsonvalues import BadValue
from sparkiq.topics.keys import PARTITIONING_PREFIX, Murmur2Partitioner
from sparkiq.topics.records import SCHEMAS_TOPIC, SchemaMismatch, TopicFormat, table_schema
from sparkiq.topics.schemas import SchemaWatch, published_format
from sparkiq.topics.spec import TopicSpec

__all__ = ["TopicSource", "TopicSpec"]

log = logging.getLogger("sparkiq.topic")

# How many batches one call of commits_after reads before handing back: a restore reads the
# topic over several polls, so status and other tables are not held up by one long read.
_BATCHES_PER_POLL = 16


@dataclass
class _Batch:
    record: CommitRecord
    changes: dict[int, tuple[list[bytes], list[bytes | None]]]


class TopicSource:
    """One followed topic as a :class:`~sparkiq.changelog.source.ChangelogSource` (see the
    module docstring). Thread-safe: reading the consumer is serialized by a lock; batches
    are immutable once made. :meth:`close` closes the consumer."""

    restore_hint = (
        "a followed topic's batches live in memory only: follow the topic again (it restores "
        "from the topic)"
    )

    def __init__(
        self,
        spec: TopicSpec,
        bootstrap_servers: str,
        *,
        batch_records: int = 2000,
        retain_batches: int = 64,
        schema_interval: float = 30.0,
    ) -> None:
        if batch_records < 1 or retain_batches < 1 or not schema_interval > 0:
            raise ConfigError("batch_records, retain_batches and schema_interval must be positive")
        kafka = confluent()
        self.spec = spec
        self.topic = spec.topic
        self.bootstrap_servers = bootstrap_servers
        self.batch_records = batch_records
        self.retain_batches = retain_batches
        self.schema_interval = schema_interval
        self._watch: SchemaWatch | None = None  # a published topic's schema, watched
        #: why the follower stopped reading (its schema changed): the catalog opens the topic
        #: again (sparkiq.topics.schemas); None while it reads
        self.stale: str | None = None
        self._consumer = new_consumer(bootstrap_servers, spec.kafka_config, spec.topic)
        try:
            partitions = partition_count(self._consumer, spec.topic, bootstrap_servers)
            self.format = self._format()
            self._manifest = TableManifest(
                name=spec.name,
                schema=self.format.schema,
                partitions=partitions,
                output_mode="update",
                # a new one per follower: local files are never reused, it restores from the topic
                incarnation=f"topic:{spec.topic}:{uuid.uuid4().hex}",
                partitioning=PARTITIONING_PREFIX + self.format.key_format,
            )
            self._assigned = [kafka.TopicPartition(spec.topic, p) for p in range(partitions)]
            self._consumer.assign(
                [
                    kafka.TopicPartition(spec.topic, p, kafka.OFFSET_BEGINNING)
                    for p in range(partitions)
                ]
            )
        except BaseException:
            self._consumer.close()
            raise
        self._codec = KeyCodec(self.format.schema)
        self._partitioner = Murmur2Partitioner(self.format.keys, partitions)
        self._lock = threading.Lock()  # guards the consumer and everything below
        self._batches: OrderedDict[int, _Batch] = OrderedDict()
        self._next_batch = 0
        self._ends = dict.fromkeys(range(partitions), 0)
        # per partition: the end offset the consumer's last fetch saw (absent: none yet), and
        # when the follower last had read up to it (the open, before it ever had)
        self._high: dict[int, int] = {}
        self._caught_up_at = dict.fromkeys(range(partitions), time.time())
        self._closed = False
        #: records read, malformed records skipped, records read from another partition
        #: than their key's (see the module docstring)
        self.records = 0
        self.malformed = 0
        self.misplaced = 0

    def _format(self) -> TopicFormat:
        spec = self.spec
        avro = (spec.value_format or "").startswith("avro") or spec.value_schema is not None
        if spec.columns is None and not avro:
            if spec.key:
                raise ConfigError(
                    "key= needs columns=: without them the schema is read from "
                    f"{SCHEMAS_TOPIC!r}, key columns included"
                )
            doc, ends = read_published(self._consumer, spec.topic, self.bootstrap_servers)
            found = published_format(doc, spec)
            self._watch = SchemaWatch(
                spec, self.bootstrap_servers, found, ends, self.schema_interval
            )
            return found
        if not spec.key:
            raise ConfigError("columns= needs key=: name the key columns, e.g. key='user'")
        schema = table_schema(  # Avro values without columns: the record's fields
            spec.columns if spec.columns is not None else avro_columns(spec.value_schema, spec.key),
            spec.key,
        )
        value_format = spec.value_format or ("avro" if avro else "json")
        return TopicFormat(schema, spec.key_format or "json", value_format, spec.value_schema)

    # -- ChangelogSource ---------------------------------------------------------------------

    @property
    def table(self) -> str:
        return self.spec.name

    def manifest(self) -> TableManifest:
        return self._manifest

    def committed_batch_ids(self) -> list[int]:
        with self._lock:
            return list(self._batches)

    def has_commit(self, batch_id: int) -> bool:
        return batch_id in self._batches

    def read_commit(self, batch_id: int) -> CommitRecord | None:
        batch = self._batches.get(batch_id)
        return None if batch is None else batch.record

    def commits_after(self, batch_id: int) -> Iterator[CommitRecord]:
        """The batches after ``batch_id`` still held, then new ones read from the topic now
        (up to a few per call); stops at the first one missing."""
        next_id = batch_id + 1
        read = 0
        while True:
            with self._lock:
                batch = self._batches.get(next_id)
                if batch is None:
                    if (
                        next_id != self._next_batch
                        or read >= _BATCHES_PER_POLL
                        or self._closed
                        or self.stale is not None
                    ):
                        return
                    batch = self._read_batch()
                    read += 1
                    if batch is None:
                        return
            yield batch.record
            next_id += 1

    def read_changes(
        self, record: CommitRecord, partition: int
    ) -> tuple[list[bytes], list[bytes | None]]:
        batch = self._batches.get(record.batch_id)
        if batch is None:
            raise ChangelogError(
                f"batch {record.batch_id} of topic {self.topic!r} (table {self.table!r}) is no "
                f"longer held (the newest {self.retain_batches} are): {self.restore_hint}",
                store=self.table,
                partition=partition,
            )
        return batch.changes.get(partition, ([], []))

    def read_change_columns(
        self, record: CommitRecord, partition: int
    ) -> tuple[pa.Array, pa.Array] | None:
        return None

    def has_changes(self, record: CommitRecord, partition: int) -> bool:
        batch = self._batches.get(record.batch_id)
        return batch is not None and partition in batch.changes

    def snapshots(self, partition: int) -> list[SnapshotInfo]:
        return []  # the compacted topic is the snapshot: a restore reads it from the start

    def read_snapshot(self, info: SnapshotInfo) -> tuple[list[bytes], list[bytes]]:
        raise CorruptSegmentError(f"a followed topic has no snapshots ({self.topic!r})")

    # -- reading the topic -------------------------------------------------------------------

    def _read_batch(self) -> _Batch | None:
        """Read what the consumer has now (up to ``batch_records``) as the next batch; None
        when it has nothing and its position did not move. Called under the lock."""
        kafka = confluent()
        if self._watch is not None and self._watch.due() and self._schema_changed():
            return None
        messages = self._consumer.consume(self.batch_records, timeout=0)
        latest: dict[int, dict[bytes, dict[str, Any] | None]] = {}
        read = 0
        checked = False  # the schema, once per read: what it read was fetched before
        before, first = dict(self._ends), dict[int, int]()  # to read it again
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != kafka.KafkaError._PARTITION_EOF:
                    log.warning("topic %r: %s", self.topic, error)
                continue
            read += 1
            partition, offset = message.partition(), message.offset()
            first.setdefault(partition, offset)
            self._ends[partition] = max(self._ends[partition], offset + 1)
            try:
                placed, key, row = self._decode(message)
            except BadValue as exc:
                if self._watch is not None and not checked:
                    checked = True
                    if self._schema_changed():
                        return None  # nothing of this read is applied by the old columns
                    if self._watch.failed:  # unknown: read it all again at the next poll
                        self._ends = before
                        for p, o in first.items():
                            self._consumer.seek(kafka.TopicPartition(self.topic, p, o))
                        return None
                try:
                    if not isinstance(exc, SchemaMismatch):
                        raise
                    # the schema did not change: a member more is ignored, one less is null
                    placed, key, row = self._decode(message, strict=False)
                except BadValue as final:
                    self._skip(partition, offset, str(final))
                    continue
            if placed != partition:
                self._misplaced(partition, offset, placed)
            changes = latest.setdefault(placed, {})
            changes.pop(key, None)  # the newest record of a key wins, in read order
            changes[key] = row
        self.records += read
        # Past a transaction's commit marker (a record the consumer never hands over) the
        # position moves on its own: the end offsets must too, or a follower of a
        # transactional topic would never reach the broker's end offsets.
        moved = False
        for tp in self._consumer.position(self._assigned):
            if tp.offset > self._ends[tp.partition]:
                self._ends[tp.partition] = tp.offset
                moved = True
        self._observe_ends()
        if not read and not moved:
            return None
        batch_id = self._next_batch
        encoded = {p: self._encode(rows) for p, rows in latest.items()}
        record = CommitRecord(
            table=self.table,
            batch_id=batch_id,
            mode="update",
            segments={p: SegmentInfo(p, len(keys), 0, "") for p, (keys, _) in encoded.items()},
            position={KAFKA_PREFIX + self.topic: dict(self._ends)},
            committed_at=time.time(),
        )
        batch = _Batch(record, encoded)
        self._batches[batch_id] = batch
        self._next_batch = batch_id + 1
        while len(self._batches) > self.retain_batches:
            self._batches.popitem(last=False)
        return batch

    def _observe_ends(self) -> None:
        """Note each partition's end offset as the consumer's last fetch saw it (librdkafka's
        cached high watermark: no broker request), and the time if it has read up to it."""
        now = time.time()
        for tp in self._assigned:
            high = self._consumer.get_watermark_offsets(tp, cached=True)[1]
            if high >= 0:  # negative: nothing fetched yet
                self._high[tp.partition] = high
            known = self._high.get(tp.partition)
            if known is not None and self._ends[tp.partition] >= known:
                self._caught_up_at[tp.partition] = now

    def _schema_changed(self) -> bool:
        """Whether the published schema changed since the follower opened; if so it stops
        reading (:attr:`stale`) for the catalog to open the topic again."""
        assert self._watch is not None
        found = self._watch.check()
        if found is not None:
            columns = ", ".join(f"{f.name} {f.type.simple_string()}" for f in found.schema.fields)
            self.stale = f"its schema in {SCHEMAS_TOPIC!r} changed (now {columns})"
        elif self._watch.unreadable is not None:  # following again fails, and says why
            self.stale = f"its schema in {SCHEMAS_TOPIC!r} changed: {self._watch.unreadable}"
        else:
            return False
        log.info("topic %r: %s; following it again", self.topic, self.stale)
        return True

    def _decode(
        self, message: Any, *, strict: bool | None = None
    ) -> tuple[int, bytes, dict[str, Any] | None]:
        """(table partition, encoded key, row or None) of one record."""
        data = message.key()
        if data is None:
            raise BadValue("the record has no key")
        internal = self.format.keys.read(data)
        encoded = self._codec.encode(internal)
        placed = self._partitioner(internal)
        value = message.value()
        if value is None:
            return placed, encoded, None
        shown = self._codec.from_internal(internal)
        names = self.format.schema.key_columns
        key = dict(zip(names, shown if len(names) > 1 else (shown,), strict=True))
        return placed, encoded, self.format.read_value(key, value, strict=strict)

    def _encode(
        self, rows: dict[bytes, dict[str, Any] | None]
    ) -> tuple[list[bytes], list[bytes | None]]:
        keys = list(rows)
        present = [r for r in rows.values() if r is not None]
        encoded: Iterator[bytes | None]
        try:
            encoded = iter(self.format.encode_rows(present))
        except BadValue:  # one row Arrow refuses: find it, keep the others
            encoded = iter(self._encode_each(rows))
        values: list[bytes | None] = [None if r is None else next(encoded) for r in rows.values()]
        kept = [
            (k, v)
            for k, v, r in zip(keys, values, rows.values(), strict=True)
            if v is not None or r is None
        ]
        return [k for k, _ in kept], [v for _, v in kept]

    def _encode_each(self, rows: dict[bytes, dict[str, Any] | None]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for row in rows.values():
            if row is None:
                continue
            try:
                out.append(self.format.encode_rows([row])[0])
            except BadValue as exc:
                self.malformed += 1
                log.warning(
                    "topic %r: skipping a row that does not fit the columns: %s", self.topic, exc
                )
                out.append(None)
        return out

    def _skip(self, partition: int, offset: int, reason: str) -> None:
        self.malformed += 1
        log.warning(
            "topic %r partition %d offset %d: skipping a malformed record (%s)",
            self.topic,
            partition,
            offset,
            reason,
        )

    def _misplaced(self, partition: int, offset: int, placed: int) -> None:
        self.misplaced += 1
        if self.misplaced == 1:
            log.warning(
                "topic %r partition %d offset %d: the key's partition by Kafka's default "
                "partitioner is %d; the row is kept there (its producer does not partition "
                "by murmur2 over the key as %s writes it; later ones are counted, not logged)",
                self.topic,
                partition,
                offset,
                placed,
                self.format.key_format,
            )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def positions(self) -> dict[int, int]:
        """The end offset read of every partition (the next offset to read)."""
        with self._lock:
            return dict(self._ends)

    def high_watermarks(self) -> dict[int, int]:
        """Per partition, the end offset the consumer's last fetch saw (the high watermark:
        records of a transaction still open count); a partition not fetched yet is absent.
        Never blocks: librdkafka's cache, which its fetches keep current between reads."""
        out = dict(self._high)
        try:
            for tp in self._assigned:
                high = self._consumer.get_watermark_offsets(tp, cached=True)[1]
                if high >= 0:
                    out[tp.partition] = max(high, out.get(tp.partition, high))
        except RuntimeError:  # closed meanwhile: what the last read saw
            return dict(self._high)
        return out

    def caught_up_at(self) -> dict[int, float]:
        """Per partition, when (``time.time()``) the follower last had read every record its
        last fetch saw; the time it opened before it ever had. Never blocks."""
        return dict(self._caught_up_at)

    def end_offsets(self, timeout: float = 10.0) -> dict[int, int]:
        """The broker's end offsets of the topic now, as a read_committed consumer sees them
        (the last stable offset of each partition)."""
        kafka = confluent()
        with self._lock:
            return {
                p: self._consumer.get_watermark_offsets(
                    kafka.TopicPartition(self.topic, p), timeout=timeout
                )[1]
                for p in self._ends
            }

    def close(self) -> None:
        """Close the consumer. Idempotent; batches already read stay readable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._consumer.close()
            if self._watch is not None:
                self._watch.close()

    def __repr__(self) -> str:
        return f"TopicSource({self.topic!r} as {self.table!r})"
