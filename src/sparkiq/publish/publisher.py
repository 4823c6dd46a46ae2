"""Following a table's changelog and producing each committed batch to a compacted topic,
exactly once, with Kafka transactions.

One :class:`TablePublisher` per (table, topic). When it connects it:

1. creates the topic (compacted, the table's partition count) and :data:`SCHEMA_TOPIC`
   when absent, and refuses a topic that is not compacted (:mod:`sparkiq.publish.topic`);
2. calls ``init_transactions`` with a transactional id derived from the table and topic
   (``sparkiq-publish.<table>.<topic>``), stable across restarts: a restarted publisher
   fences the previous one, whose open transaction the broker aborts;
3. reads where the topic stopped from the topic itself, ``read_committed`` (the highest
   ``sparkiq.batch`` header among the last records of every partition), never from a local
   file that could disagree;
4. publishes the schema record when the schema topic does not hold this one.

Then, for every committed batch after that, in batch order: encode its changes (every
changelog partition's; :class:`~sparkiq.publish.records.RecordEncoder`), begin a
transaction, produce them (partition: librdkafka's ``murmur2_random``, the Java client's
murmur2 of the key bytes for every non-null key) with the headers ``sparkiq.table``,
``sparkiq.batch`` and ``sparkiq.position``, commit. A ``read_committed`` consumer sees each
batch whole or not at all, and never twice: a crash before the commit leaves an aborted
transaction, and the restart finds the batch missing and produces it again.

A batch with no changes is no transaction (there is nothing to see). A ``complete``-mode
batch replaces the table: keys of the previous batch that it lacks get tombstones.

Failures: batches the topic lacks but retention deleted stop the publisher with
:class:`PublishGapError` (publish to a new topic; see docs/kafka.md); another publisher
taking over stops it with :class:`PublisherFencedError`; a topic that is not compacted or
holds foreign records with :class:`PublishError`. Anything else (the broker away, a
transaction timed out) is retried after a pause, reconnecting from step 1, and shows in
:meth:`TablePublisher.status` meanwhile.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog import Changelog, CommitRecord
from sparkiq.errors import ChangelogError, ConfigError
from sparkiq.publish import topic as topics
from sparkiq.publish.errors import PublisherFencedError, PublishError, PublishGapError
from sparkiq.publish.records import SCHEMA_TOPIC, RecordEncoder, schema_document
from sparkiq.publish.state import state_at
from sparkiq.query.position import Position

__all__ = ["PAUSE_VARIABLE", "PublisherStatus", "TablePublisher", "transactional_id"]

log = logging.getLogger("sparkiq.publish")

#: Test hook: seconds to wait between producing a batch and committing its transaction (a
#: crash test kills the publisher inside a transaction). Never set it in production.
PAUSE_VARIABLE = "SPARKIQ_TEST_PUBLISH_PAUSE"
INSTALL_HINT = "pip install 'sparkiq[kafka]'"
#: Producer settings a publisher owns: the user's config may not change them.
_OWN = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}
#: Seconds between listings of the commits while caught up (see ``_pending``).
_LIST_EVERY = 30.0
# Big batches are produced whole before the commit: let the client queue one.
_QUEUE = {"queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_097_151}


def transactional_id(table: str, topic: str) -> str:
    """The transactional id of table ``table``'s publisher to ``topic`` (stable: a restart
    fences the publisher before it)."""
    return f"sparkiq-publish.{table}.{topic}"


@dataclass(frozen=True, slots=True)
class PublisherStatus:
    """What a publisher has done and how far behind the changelog it is.

    ``state``: ``starting``, ``publishing``, ``caught_up``, ``retrying`` (a fault it retries;
    ``error`` says which), ``failed`` or ``fenced`` (stopped; ``error`` says why) or
    ``stopped``. ``published_batch`` is the newest batch the topic holds (-1: none known
    yet); ``head_batch`` the changelog's newest committed batch; ``batches_behind`` and
    ``rows_behind`` what lies between them. ``updated_at``: Unix seconds."""

    table: str
    topic: str
    state: str
    published_batch: int
    head_batch: int
    batches_behind: int
    rows_behind: int
    records_published: int
    error: str | None
    updated_at: float

    def to_record(self) -> dict[str, Any]:
        """The fields the writer status record keeps (:mod:`sparkiq.changelog.writer_status`)."""
        return {
            "topic": self.topic,
            "state": self.state,
            "published_batch": self.published_batch,
            "head_batch": self.head_batch,
            "batches_behind": self.batches_behind,
            "rows_behind": self.rows_behind,
            "error": self.error,
        }

    def line(self) -> str:
        """One line for a log or a status display."""
        text = (
            f"{self.table} -> {self.topic}: {self.state}, published batch "
            f"{self.published_batch}, head {self.head_batch}, {self.batches_behind} batches / "
            f"{self.rows_behind} rows behind"
        )
        return text + (f" ({self.error})" if self.error else "")


class TablePublisher:
    """Publishes table ``table`` of ``state_dir`` to ``topic`` (see the module docstring).

    ``kafka_config`` is confluent-kafka (librdkafka) client config: ``bootstrap.servers``
    and any security settings; ``transactional.id`` may be given to override the derived
    one. ``poll_interval`` is how often the changelog is probed for new commits; ``timeout``
    bounds each broker request. Use :meth:`start` / :meth:`stop` for a background thread,
    :meth:`run` in the foreground, or :meth:`publish_available` for one pass. Raises
    :class:`~sparkiq.errors.ConfigError` for bad arguments and when confluent-kafka is not
    installed.
    """

    def __init__(
        self,
        state_dir: str,
        table: str,
        topic: str,
        kafka_config: Mapping[str, Any],
        *,
        key_format: str = "json",
        value_format: str = "json",
        poll_interval: float = 0.2,
        timeout: float = 30.0,
    ) -> None:
        self._kafka = _client_module()
        if not isinstance(topic, str) or not topic or len(topic) > 249:
            raise ConfigError(f"kafka_topic must be a topic name (1-249 characters), got {topic!r}")
        if not isinstance(kafka_config, Mapping):
            raise ConfigError(
                "kafka_config must be a dict of Kafka client settings such as "
                f"{{'bootstrap.servers': 'host:9092'}}, got {type(kafka_config).__name__}"
            )
        if not kafka_config.get("bootstrap.servers"):
            raise ConfigError(
                f"publishing {table!r} to {topic!r} needs the Kafka brokers: give "
                "kafka_config={'bootstrap.servers': 'host:9092'} (or set "
                "SPARKIQ_KAFKA_BOOTSTRAP)",
                store=table,
            )
        for name, value in _OWN.items():
            if name in kafka_config and str(kafka_config[name]).lower() != str(value).lower():
                raise ConfigError(
                    f"kafka_config sets {name}={kafka_config[name]!r}; a publisher needs "
                    f"{name}={value!r} (exactly once, and the partitioning the record format "
                    "documents): leave it out",
                    store=table,
                )
        self.changelog = Changelog(state_dir, table, read_only=True)
        self.manifest = self.changelog.manifest()  # UnknownStoreError naming the tables
        self.encoder = RecordEncoder(self.manifest, key_format, value_format)
        self.table, self.topic = table, topic
        self.config = dict(kafka_config)
        self.transactional_id = str(
            self.config.pop("transactional.id", None) or transactional_id(table, topic)
        )
        self.poll_interval, self.timeout = float(poll_interval), float(timeout)
        self._producer: Any = None
        self._published = -1
        self._state, self._error = "starting", None
        self._head, self._rows_behind, self._records = -1, 0, 0
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopped_by: PublishError | ConfigError | None = None
        self._listed_at = -_LIST_EVERY

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> TablePublisher:
        """Publish on a background daemon thread until :meth:`stop` (idempotent)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self.run,
                args=(self._stop,),
                name=f"sparkiq-publish-{self.table}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (a transaction in flight is finished or aborted first) and close
        the producer."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._close()
        with self._changed:
            if self._state not in ("failed", "fenced"):
                self._state = "stopped"
            self._changed.notify_all()

    def run(self, stop: threading.Event) -> None:
        """Publish until ``stop`` is set or a failure that retrying cannot fix (then the
        status is ``failed`` or ``fenced`` with the reason, also logged)."""
        backoff = 0.5
        while not stop.is_set():
            try:
                if self.publish_available(stop) == 0:
                    stop.wait(self.poll_interval)
                backoff = 0.5
            except (PublishError, ConfigError):  # the status and the log say why
                return
            except (ChangelogError, self._kafka.KafkaException, OSError) as exc:
                self._set(state="retrying", error=_text(exc))
                log.warning("%s: retrying in %.1f s: %s", self._name, backoff, _text(exc))
                self._close()
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _fail(self, state: str, exc: PublishError | ConfigError) -> None:
        self._set(state=state, error=exc.message)
        log.error("%s: stopped: %s", self._name, exc.message)
        self._close()

    # -- status ------------------------------------------------------------------------------

    @property
    def _name(self) -> str:
        return f"publishing {self.table!r} to {self.topic!r}"

    def status(self) -> PublisherStatus:
        with self._changed:
            return PublisherStatus(
                table=self.table,
                topic=self.topic,
                state=self._state,
                published_batch=self._published,
                head_batch=self._head,
                batches_behind=max(0, self._head - self._published),
                rows_behind=self._rows_behind,
                records_published=self._records,
                error=self._error,
                updated_at=time.time(),
            )

    def wait_for(self, batch_id: int, timeout: float | None = None) -> bool:
        """Wait until the topic holds batch ``batch_id`` (True) or the publisher stopped or
        ``timeout`` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._published < batch_id and self._state not in ("failed", "fenced"):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return self._published >= batch_id

    def _set(self, **changes: Any) -> None:
        with self._changed:
            for name, value in changes.items():
                setattr(self, f"_{name}", value)
            self._changed.notify_all()

    # -- publishing --------------------------------------------------------------------------

    def publish_available(self, stop: threading.Event | None = None) -> int:
        """Connect if needed, then publish every batch committed now that the topic lacks;
        return how many batches were published (0: caught up).

        A :class:`PublishError` (fenced, a gap, a refused topic, a fatal producer error) or
        a :class:`~sparkiq.errors.ConfigError` (a client setting librdkafka refuses) stops
        this publisher for good: it is raised again by every later call, and never followed
        by a reconnection, which would fence the publisher that took over."""
        if self._stopped_by is not None:
            raise self._stopped_by
        try:
            return self._publish_available(stop)
        except (PublishError, ConfigError) as exc:
            self._stopped_by = exc
            self._fail("fenced" if isinstance(exc, PublisherFencedError) else "failed", exc)
            raise

    def _publish_available(self, stop: threading.Event | None) -> int:
        if self._producer is None:
            self._connect()
        pending = self._pending()
        count = 0
        for record in pending:
            if stop is not None and stop.is_set():
                break
            self._set(state="publishing", error=None)
            self._publish(record)
            with self._changed:
                self._published = record.batch_id
                self._rows_behind = max(0, self._rows_behind - record.rows)
                self._changed.notify_all()
            count += 1
        if self._published >= self._head:
            self._set(state="caught_up", error=None)
        return count

    def _pending(self) -> list[CommitRecord]:
        """The committed batches after the published one, in order; raises
        PublishGapError when the next one is gone but later ones are committed."""
        wanted = self._published + 1
        records = list(self.changelog.commits_after(self._published))
        # Nothing next: caught up, or the next batch was deleted under a publisher that fell
        # behind. Listing the commits tells (an object store LIST), so it is done when a
        # later batch was seen before, and otherwise now and then.
        now = time.monotonic()
        if not records and (self._head >= wanted or now >= self._listed_at + _LIST_EVERY):
            self._listed_at = now
            later = [b for b in self.changelog.committed_batch_ids() if b > wanted]
            if later:
                raise self._gap(wanted, later[0])
        head = records[-1].batch_id if records else max(self._head, self._published)
        self._set(head=head, rows_behind=sum(r.rows for r in records))
        return records

    def _publish_state(self, first: int, head: int) -> int:
        """Start an empty topic whose table's first batches are gone with the table's rows
        at batch ``head`` (:mod:`sparkiq.publish.state`); return ``head``."""
        record = self.changelog.read_commit(head)
        state = state_at(self.changelog, head)
        if record is None or isinstance(state, str):
            raise self._gap(0, first, f" ({state})" if isinstance(state, str) else "")
        log.info("%s: the table's first batches are gone: starting with its rows", self._name)
        self._produce(record, [self.encoder.encode(keys, rows) for keys, rows in state])
        return head

    def _gap(self, wanted: int, first: int, why: str = "") -> PublishGapError:
        return PublishGapError(
            f"{self._name}: the topic holds batches up to {wanted - 1} but the changelog's "
            f"oldest batch is {first}: batches {wanted}..{first - 1} were deleted by "
            f"retention before they were published{why}, and publishing later ones would "
            "leave the topic wrong (their changes missing). Publish the table to a new topic "
            "(an empty topic starts with the table's rows, from its snapshots: `sparkiq "
            "compact` writes them), or delete this topic and publish again; keep retention "
            "longer than a publisher may be down.",
            store=self.table,
        )

    def _connect(self) -> None:
        kafka = self._kafka
        base = {"logger": _ClientLog(), **self.config}
        try:
            admin = kafka.admin.AdminClient(base)
            producer = kafka.Producer(
                {
                    **_QUEUE,
                    "linger.ms": 5,
                    **base,
                    **_OWN,
                    "transactional.id": self.transactional_id,
                }
            )
            consumer = kafka.Consumer(topics.consumer_config(base))
        except kafka.KafkaException as exc:
            raise ConfigError(
                f"kafka_config of {self._name}: {_text(exc)}", store=self.table
            ) from exc
        try:
            timeout = self.timeout
            partitions = self.manifest.partitions
            count = topics.ensure_topic(
                kafka, admin, self.topic, partitions, timeout=timeout, store=self.table
            )
            topics.ensure_topic(kafka, admin, SCHEMA_TOPIC, 1, timeout=timeout, store=self.table)
            # fences an older publisher and aborts its open transaction before reading back
            self._transact(lambda: producer.init_transactions(timeout))
            published = topics.last_published_batch(
                kafka, consumer, self.topic, count, self.table, timeout=timeout
            )
            schema = schema_document(
                self.manifest, self.topic, self.encoder.key_format, self.encoder.value_format
            )
            current = topics.read_schema_record(
                kafka, consumer, SCHEMA_TOPIC, self.topic, timeout=timeout
            )
        finally:
            consumer.close()
        if current is not None and current.get("table") != self.table:
            raise PublishError(
                f"{self._name}: the topic is registered in {SCHEMA_TOPIC!r} as table "
                f"{current.get('table')!r}'s: publish each table to a topic of its own",
                store=self.table,
            )
        self._producer = producer
        if current != schema:
            import json

            value = json.dumps(schema, separators=(",", ":")).encode()
            self._in_transaction(lambda: producer.produce(SCHEMA_TOPIC, value, self.topic.encode()))
        committed = self.changelog.committed_batch_ids()
        if published > (committed[-1] if committed else -1):
            raise PublishError(
                f"{self._name}: the topic holds batch {published} but the table's newest "
                f"committed batch is {committed[-1] if committed else 'none'}: the table was "
                "rebuilt (deleted and materialized again) since it was published there. "
                "Publish it to a new topic, or delete this one first.",
                store=self.table,
            )
        if committed and committed[0] > published + 1:
            if published >= 0:
                raise self._gap(published + 1, committed[0])
            published = self._publish_state(committed[0], committed[-1])
        self._set(published=published, state="publishing", error=None)
        log.info("%s: the topic holds batches up to %d", self._name, published)

    def _publish(self, record: CommitRecord) -> None:
        self._produce(record, self._encoded(record))

    def _produce(
        self, record: CommitRecord, encoded: list[tuple[list[bytes], list[bytes | None]]]
    ) -> None:
        """Produce ``encoded`` changes as batch ``record`` in one transaction (none when
        there is nothing to produce)."""
        if not any(keys for keys, _ in encoded):
            return
        position = dict(record.position)
        position[self.table] = {p: record.batch_id for p in range(self.manifest.partitions)}
        headers = [
            (topics.TABLE_HEADER, self.table.encode()),
            (topics.BATCH_HEADER, str(record.batch_id).encode()),
            (topics.POSITION_HEADER, Position.from_map(position).to_token().encode()),
        ]
        producer, topic = self._producer, self.topic

        def produce_all() -> None:
            for keys, values in encoded:
                for key, value in zip(keys, values, strict=True):
                    while True:
                        try:
                            producer.produce(topic, value, key, headers=headers)
                            break
                        except BufferError:  # the queue is full: let it drain
                            producer.poll(0.05)
            self._records += sum(len(keys) for keys, _ in encoded)

        self._in_transaction(produce_all, f"batch {record.batch_id}")

    def _encoded(self, record: CommitRecord) -> list[tuple[list[bytes], list[bytes | None]]]:
        """Key and value bytes of every change of a batch, by changelog partition."""
        changes = []
        for p in sorted(record.segments):
            if not self.changelog.storage.exists(self.changelog.committed_segment_path(record, p)):
                raise self._gap(record.batch_id, record.batch_id + 1)
            keys, rows = self.changelog.read_segment(record, p)
            changes.append((keys, rows))
        if record.mode == "complete" and record.batch_id > 0:
            changes.extend(self._removed(record, changes))
        return [self.encoder.encode(keys, rows) for keys, rows in changes]

    def _removed(
        self, record: CommitRecord, changes: list[tuple[list[bytes], list[bytes | None]]]
    ) -> list[tuple[list[bytes], list[bytes | None]]]:
        """Tombstones of the keys a complete-mode batch no longer has (the previous batch
        held the whole table)."""
        previous = self.changelog.read_commit(record.batch_id - 1)
        if previous is None:
            raise self._gap(record.batch_id - 1, record.batch_id)
        kept = {k for keys, _ in changes for k in keys}
        out: list[tuple[list[bytes], list[bytes | None]]] = []
        for p in sorted(previous.segments):
            gone = [k for k in self.changelog.read_segment(previous, p)[0] if k not in kept]
            out.append((gone, [None] * len(gone)))
        return out

    def _in_transaction(self, produce: Any, batch: str | None = None) -> None:
        """Run ``produce`` in one transaction and commit it; an abortable failure aborts and
        runs it again, whole. ``batch`` names a batch's transaction (the test pause)."""
        producer = self._producer
        pause = float(os.environ.get(PAUSE_VARIABLE) or 0) if batch else 0.0
        while True:
            self._transact(producer.begin_transaction)
            try:
                produce()
                if pause:
                    producer.flush(self.timeout)
                    log.info("%s: test pause: %s produced, not committed", self._name, batch)
                    time.sleep(pause)
                self._commit()
                return
            except self._kafka.KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if error is None or not error.txn_requires_abort():
                    fenced = self._fenced(exc)
                    if fenced is not None:
                        raise fenced from exc
                    raise
                log.warning("%s: aborting a transaction: %s", self._name, _text(exc))
                self._transact(lambda: producer.abort_transaction(self.timeout))

    def _commit(self) -> None:
        while True:
            try:
                self._producer.commit_transaction(self.timeout)
                return
            except self._kafka.KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if error is None or not error.retriable():
                    raise
                log.info("%s: committing again: %s", self._name, _text(exc))

    def _transact(self, call: Any) -> None:
        """A transaction call, with fencing turned into :class:`PublisherFencedError`."""
        try:
            call()
        except self._kafka.KafkaException as exc:
            fenced = self._fenced(exc)
            if fenced is not None:
                raise fenced from exc
            raise

    def _fenced(self, exc: BaseException) -> PublishError | None:
        """The error that stops this publisher for ``exc``: fenced, or a fatal producer
        error (the producer cannot go on; a new one would fence whoever took over); None
        for another error."""
        error = exc.args[0] if exc.args else None
        codes = {
            getattr(self._kafka.KafkaError, name, None)
            for name in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
        }
        if error is None or not hasattr(error, "code"):
            return None
        fenced = error.code() in codes or (error.fatal() and "fenced" in _text(exc).lower())
        if not fenced:
            if not error.fatal():
                return None
            return PublishError(
                f"{self._name}: the Kafka producer failed for good ({_text(exc)}); this "
                "publisher stops. Fix the cause, then start it again: it resumes where the "
                "topic stopped.",
                store=self.table,
            )
        return PublisherFencedError(
            f"{self._name}: another publisher with transactional id "
            f"{self.transactional_id!r} took over ({_text(exc)}); this one stops. Run one "
            "publisher per table and topic (a second one, e.g. a restart, fences the first).",
            store=self.table,
        )

    def _close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(1.0)
            except Exception:  # closing a failed producer: nothing more to save
                log.debug("closing the producer of %s", self._name, exc_info=True)


class _ClientLog:
    """What librdkafka logs (a fenced producer's fatal error, retries), at DEBUG on
    ``sparkiq.publish.client``: the publisher reports what matters itself."""

    _log = logging.getLogger("sparkiq.publish.client")

    def log(self, level: int, message: str, *args: object) -> None:
        self._log.debug(message, *args)


def _client_module() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as exc:
        raise ConfigError(
            f"publishing a table to Kafka needs the client confluent-kafka, which is not "
            f"installed ({exc}): {INSTALL_HINT}"
        ) from None
    return confluent_kafka


def _text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else exc
    text = getattr(error, "str", None)
    return text() if callable(text) else str(error) or type(exc).__name__
