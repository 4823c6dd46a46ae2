"""Kafka lag: per table, the Kafka topics it reads, the offsets its replicas applied, and how
far those are behind the topics' end offsets on the broker.

**Applied offsets** need no broker. Every commit record carries the ``kafka:<topic>``
components of its batch (``{partition: end offset}``, the next offset the source reads: see
:mod:`sparkiq.query.position`), and a replica's position is that of the last batch it
applied. :func:`kafka_sources` reads them from the node's :class:`ReplicaStatus` list: per
topic partition, the *smallest* offset over the hosted partitions of the table, so the lag
shown is that of the table's least advanced partition here (every partition reaches a
batch's offsets when it applies that batch).

**End offsets** come from the broker, only when the node is given one
(``kafka_bootstrap``): :class:`KafkaEndOffsets` asks it on one background daemon thread
every ``interval`` seconds, each request bounded by a timeout, and keeps the last answer per
topic with the time it was fetched. Nothing that answers a request (HTTP handlers, the
metrics scrape, ``status.json``) waits for the broker: they read that cache. A broker that
does not answer shows as ``unreachable`` with the client's error, never as a hang; the end
offsets of its last answer, if any, stay shown with their age.

The broker client is confluent-kafka (librdkafka), the optional extra ``sparkiq[kafka]``: it
is imported when a :class:`KafkaEndOffsets` is made, and its absence is a
:class:`~sparkiq.errors.ConfigError` that says how to install it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sparkiq.changelog.replica import ReplicaStatus
from sparkiq.errors import ConfigError
from sparkiq.topics.consumer import redact
from sparkiq.topics.lag import TopicLag, topic_lags

if TYPE_CHECKING:
    from sparkiq.serving.config import NodeConfig
    from sparkiq.topics.catalog import TopicCatalog

__all__ = [
    "KAFKA_COMPONENT",
    "KafkaEndOffsets",
    "KafkaLag",
    "KafkaPartitionLag",
    "KafkaSource",
    "TopicEnds",
    "committed_lines",
    "kafka_lines",
    "kafka_sources",
]

log = logging.getLogger("sparkiq.kafka")

#: The prefix of a position component that holds a Kafka topic's offsets.
KAFKA_COMPONENT = "kafka:"
#: What installs the broker client (the error of a node asked for a broker without it).
INSTALL_HINT = "pip install 'sparkiq[kafka]'"
#: The longest a metadata or offsets request may take (shorter with a short interval).
MAX_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class TopicEnds:
    """What the broker said last of one topic.

    ``offsets`` (``{partition: end offset}``, the high watermark: the offset the next record
    produced gets) and ``fetched_at`` (``time.time()``) are those of the last round that
    succeeded, None before any did; ``error`` says why the last round failed (None: it
    succeeded)."""

    topic: str
    offsets: Mapping[int, int] | None
    fetched_at: float | None
    error: str | None


class KafkaEndOffsets:
    """The end offsets of the topics ``topics()`` names, fetched from ``bootstrap_servers``
    every ``interval`` seconds on a background thread (:meth:`start`) and cached.

    ``topics`` is called on that thread at each round (the node passes the topics its
    replicas' positions name). Each round is one metadata request (of every topic: asking for
    one topic by name may make a broker create it) and one offsets request, each bounded by
    ``timeout`` seconds (default: twice the interval, between 2 and
    :data:`MAX_TIMEOUT_SECONDS`), made with the ``client`` settings (SASL, TLS...; never
    logged, and redacted from errors) over its own. :meth:`get` never blocks: it reads the
    cache, which a round replaces whole. :meth:`close` stops the thread without waiting for
    a request in flight (the thread is a daemon and ends after it). Raises
    :class:`~sparkiq.errors.ConfigError` when confluent-kafka is not installed or
    ``interval`` is not positive.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: Callable[[], Iterable[str]],
        *,
        interval: float = 5.0,
        timeout: float | None = None,
        client: Mapping[str, Any] | None = None,
    ) -> None:
        if not interval > 0:
            raise ConfigError(f"the Kafka end-offset interval must be positive, got {interval!r}")
        self._client = _client_module()
        self.bootstrap_servers = bootstrap_servers
        self.interval = float(interval)
        self.timeout = (
            min(MAX_TIMEOUT_SECONDS, max(2.0, 2 * self.interval)) if timeout is None else timeout
        )
        self._topics = topics
        self._settings = dict(client or {})  # never logged: it may hold secrets
        self._ends: Mapping[str, TopicEnds] = MappingProxyType({})
        self._admin: Any = None  # made by the first round, on the thread
        self._last_error: str | None = None  # logged once per distinct error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _thread (start and close)

    def start(self) -> KafkaEndOffsets:
        """Start fetching (a round now, then every ``interval``). Idempotent."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="sparkiq-kafka-ends", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop fetching; waits at most 1 s for the thread (a request in flight ends on its
        own, within its timeout). Idempotent."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None:
            thread.join(timeout=1.0)

    def get(self, topic: str) -> TopicEnds | None:
        """The cached end offsets of ``topic`` (None: no round has asked for it yet)."""
        return self._ends.get(topic)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.refresh()
            except Exception:  # a bug here must not end the thread: the next round retries
                log.exception("fetching Kafka end offsets failed")
            stop.wait(self.interval)

    def refresh(self) -> None:
        """One round now, on the calling thread: ask the broker for the end offsets of every
        topic ``topics()`` names, and replace the cache. Failures are recorded per topic."""
        topics = sorted(set(self._topics()))
        if not topics:
            return
        fetched_at = time.time()
        try:
            found = self._fetch(topics)
        except Exception as exc:  # the client's KafkaException, or a bad configuration
            found = {topic: redact(_error_text(exc), self._settings) for topic in topics}
        ends: dict[str, TopicEnds] = {}
        for topic in topics:
            result, old = found[topic], self._ends.get(topic)
            if isinstance(result, str):  # keep the last answer, and its age, beside the error
                kept = (None, None) if old is None else (old.offsets, old.fetched_at)
                ends[topic] = TopicEnds(topic, *kept, result)
            else:
                ends[topic] = TopicEnds(topic, MappingProxyType(result), fetched_at, None)
        self._ends = MappingProxyType(ends)
        errors = sorted({e.error for e in ends.values() if e.error is not None})
        error = "; ".join(errors) or None
        if error is not None and error != self._last_error:
            log.warning(
                "Kafka broker %s: cannot fetch end offsets (%s); retrying every %g s",
                self.bootstrap_servers,
                error,
                self.interval,
            )
        elif error is None and self._last_error is not None:
            log.info("Kafka broker %s answers again", self.bootstrap_servers)
        self._last_error = error

    def _fetch(self, topics: Sequence[str]) -> dict[str, dict[int, int] | str]:
        """``{topic: {partition: end offset}}``, or the error text of a topic that failed."""
        kafka = self._client
        if self._admin is None:
            self._admin = kafka.admin.AdminClient(
                {
                    "bootstrap.servers": self.bootstrap_servers,
                    "client.id": "sparkiq-kafka-lag",
                    # librdkafka's own log lines (a line per failed connection attempt) go to
                    # DEBUG, not stderr: the error each round meets is logged once anyway
                    "logger": _ClientLog(),
                    "log.connection.close": False,
                    **self._settings,
                }
            )
        admin = self._admin
        try:
            metadata = admin.list_topics(timeout=self.timeout)
        finally:
            admin.poll(0)  # hands queued log lines to the logger
        out: dict[str, dict[int, int] | str] = {}
        wanted: dict[Any, Any] = {}
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None:
                out[topic] = f"the broker has no topic {topic!r}"
            elif described.error is not None:
                out[topic] = _error_text(described.error)
            else:
                out[topic] = {}
                for partition in described.partitions:
                    wanted[kafka.TopicPartition(topic, partition)] = kafka.admin.OffsetSpec.latest()
        if not wanted:
            return out
        futures = admin.list_offsets(wanted, request_timeout=self.timeout)
        deadline = time.monotonic() + self.timeout + 1.0
        for asked, future in futures.items():
            if isinstance(out[asked.topic], str):
                continue
            try:
                info = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # KafkaException, or the wait's TimeoutError
                out[asked.topic] = _error_text(exc)
                continue
            offsets = out[asked.topic]
            assert isinstance(offsets, dict)
            offsets[asked.partition] = int(info.offset)
        return out


class _ClientLog:
    """What librdkafka logs, at DEBUG on ``sparkiq.kafka.client`` whatever its level."""

    _log = logging.getLogger("sparkiq.kafka.client")

    def log(self, level: int, message: str, *args: object) -> None:
        self._log.debug(message, *args)


def _client_module() -> Any:
    """The ``confluent_kafka`` package (with its admin client), or a ConfigError saying how
    to install it."""
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError as exc:
        raise ConfigError(
            "kafka_bootstrap (--kafka-bootstrap, SPARKIQ_KAFKA_BOOTSTRAP) needs the Kafka "
            f"client confluent-kafka, which is not installed ({exc}): {INSTALL_HINT}"
        ) from None
    return confluent_kafka


def _error_text(exc: object) -> str:
    """A client error as one line: a KafkaException's KafkaError says its own text."""
    args = getattr(exc, "args", ())
    inner = args[0] if args else exc
    text = getattr(inner, "str", None)
    message = text() if callable(text) else str(inner)
    if isinstance(exc, TimeoutError) or not message:
        return f"no answer within the timeout ({type(exc).__name__})"
    return message


# -- the view ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KafkaPartitionLag:
    """One partition of a topic: the offset applied here (None: no hosted partition of the
    table has read it yet), the broker's end offset (None: unknown), and the records between
    them (None when either is unknown)."""

    partition: int
    applied: int | None
    end: int | None

    @property
    def lag(self) -> int | None:
        if self.applied is None or self.end is None:
            return None
        return max(0, self.end - self.applied)


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """One Kafka topic one table reads, as this node sees it.

    ``broker`` is ``"none"`` (the node was given no ``kafka_bootstrap``: lag unknown),
    ``"pending"`` (not fetched yet), ``"ok"`` or ``"unreachable"`` (the last round failed:
    ``error`` says why; ``end`` offsets, if any, are those of the last round that
    succeeded, ``ends_fetched_at``)."""

    table: str
    topic: str
    partitions: tuple[KafkaPartitionLag, ...]
    broker: str
    error: str | None
    ends_fetched_at: float | None

    @property
    def lag(self) -> int | None:
        """The records not applied yet, over the partitions whose lag is known (None: none)."""
        known = [p.lag for p in self.partitions if p.lag is not None]
        return sum(known) if known else None

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """The JSON form (``/stats``, ``status.json``); ``ends_age_seconds`` is measured at
        ``now`` (default: the current time)."""
        now = time.time() if now is None else now
        fetched = self.ends_fetched_at
        return {
            "table": self.table,
            "topic": self.topic,
            "broker": self.broker,
            "error": self.error,
            "ends_fetched_at": fetched,
            "ends_age_seconds": None if fetched is None else max(0.0, now - fetched),
            "lag": self.lag,
            "partitions": [
                {"partition": p.partition, "applied": p.applied, "end": p.end, "lag": p.lag}
                for p in self.partitions
            ],
        }


def applied_offsets(statuses: Iterable[ReplicaStatus]) -> dict[tuple[str, str], dict[int, int]]:
    """``{(table, topic): {partition: offset}}``: per topic partition the smallest offset
    over the hosted partitions of each table whose position names the topic."""
    out: dict[tuple[str, str], dict[int, int]] = {}
    for status in statuses:
        for component in status.position.components:
            if not component.startswith(KAFKA_COMPONENT):
                continue
            applied = out.setdefault((status.table, component[len(KAFKA_COMPONENT) :]), {})
            for partition, offset in status.position.partition_offsets(component).items():
                applied[partition] = min(offset, applied.get(partition, offset))
    return out


def kafka_sources(
    statuses: Iterable[ReplicaStatus], ends: KafkaEndOffsets | None
) -> list[KafkaSource]:
    """The Kafka sources of the tables in ``statuses`` (sorted by table, then topic), with
    the end offsets ``ends`` has cached (None: the node has no broker). Never blocks."""
    out = []
    for (table, topic), applied in sorted(applied_offsets(statuses).items()):
        known = None if ends is None else ends.get(topic)
        end_offsets: Mapping[int, int] = {}
        if ends is None:
            broker, error, fetched = "none", None, None
        elif known is None:
            broker, error, fetched = "pending", None, None
        else:
            broker = "ok" if known.error is None else "unreachable"
            error, fetched = known.error, known.fetched_at
            end_offsets = known.offsets or {}
        partitions = tuple(
            KafkaPartitionLag(p, applied.get(p), end_offsets.get(p))
            for p in sorted(set(applied) | set(end_offsets))
        )
        out.append(KafkaSource(table, topic, partitions, broker, error, fetched))
    return out


def kafka_lines(
    sources: Sequence[Mapping[str, Any]], bootstrap: str | None, now: float
) -> list[str]:
    """The text ``sparkiq status`` shows of a node's Kafka sources (their JSON form, as
    ``status.json`` holds it): a line per source, then one per partition."""
    if not sources:
        return []
    if bootstrap:
        head = f"kafka sources (end offsets from {bootstrap})"
    else:
        head = "kafka sources (lag unknown: the node has no --kafka-bootstrap)"
    lines = [head]
    for source in sources:
        fetched = source.get("ends_fetched_at")
        age = "" if fetched is None else f", end offsets {max(0.0, now - fetched):.0f} s old"
        broker = source.get("broker")
        if broker == "unreachable":
            state = f"broker unreachable: {source.get('error')}{age}"
        elif broker == "pending":
            state = "end offsets not fetched yet"
        elif broker == "ok":
            state = f"lag {source.get('lag')} records{age}"
        else:
            state = "lag unknown"
        lines.append(f"{source['table']} <- topic {source['topic']!r}: {state}")
        lines.append(f"  {'partition':>9} {'applied':>12} {'end':>12} {'lag':>10}")
        for p in source.get("partitions", []):
            cells = ("-" if p.get(f) is None else str(p[f]) for f in ("applied", "end", "lag"))
            lines.append("  {:>9} {:>12} {:>12} {:>10}".format(p["partition"], *cells))
    return lines


def committed_lines(position: Mapping[str, Mapping[int, int]], batch_id: int) -> list[str]:
    """The text ``sparkiq status`` shows under a table of what its writer read of each Kafka
    topic by batch ``batch_id``, from that batch's commit record's ``position``."""
    out = []
    for component, offsets in sorted(position.items()):
        if component.startswith(KAFKA_COMPONENT):
            read = " ".join(f"{p}:{o}" for p, o in sorted(offsets.items()))
            topic = component[len(KAFKA_COMPONENT) :]
            out.append(f"  kafka topic {topic!r} read to offsets {read} (batch {batch_id})")
    return out


class KafkaLag:
    """A node's view of its tables' Kafka topics: the offsets its replicas applied
    (``statuses``, read when asked) and, with ``config.kafka_bootstrap``, the broker's end
    offsets, refreshed every ``config.kafka_interval`` seconds on a background thread
    between :meth:`start` and :meth:`close` (its client with the ``client`` settings:
    SASL, TLS...); and the lag of the topics it follows (``followed``: their catalogs, see
    :mod:`sparkiq.topics.lag`). :class:`~sparkiq.errors.ConfigError` when a broker is given
    and the Kafka client (``sparkiq[kafka]``) is not installed."""

    def __init__(
        self,
        statuses: Callable[[], Iterable[ReplicaStatus]],
        config: NodeConfig,
        followed: Sequence[TopicCatalog] = (),
        client: Mapping[str, Any] | None = None,
    ) -> None:
        self._statuses = statuses
        self._followed = followed
        self.bootstrap = bootstrap = config.kafka_bootstrap
        self._ends = (
            None
            if bootstrap is None
            else KafkaEndOffsets(
                bootstrap, self.topics, interval=config.kafka_interval, client=client
            )
        )

    def start(self) -> None:
        if self._ends is not None:
            self._ends.start()

    def close(self) -> None:
        if self._ends is not None:
            self._ends.close()

    def topics(self) -> list[str]:
        """The topics the tables read (what the background thread asks the broker about)."""
        return sorted({s.topic for s in kafka_sources(self._statuses(), None)})

    def sources(self) -> list[KafkaSource]:
        """Per table, the topics it reads: the offsets applied here, and the end offsets
        and lag when there is a broker (from the background thread's cache: never blocks)."""
        return kafka_sources(self._statuses(), self._ends)

    def followed(self) -> list[TopicLag]:
        """The lag of every topic the node follows as a table (never blocks)."""
        sources = [s for catalog in self._followed for s in catalog.sources()]
        if not sources:
            return []
        return topic_lags(sources, applied_offsets(self._statuses()), time.time())

    def status_extra(self) -> dict[str, Any]:
        """The Kafka part of ``status.json`` (what ``sparkiq status`` shows of it)."""
        return {
            "kafka_bootstrap": self.bootstrap,
            "kafka": [s.to_dict() for s in self.sources()],
            "topics": [t.to_dict() for t in self.followed()],
        }
