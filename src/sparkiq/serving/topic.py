"""Follow a Kafka topic as a table: :func:`follow_topic`.

A compacted topic -- one sparkiq published, or any keyed topic with JSON, Avro or string values (a
Kafka Streams store's changelog, a ksqlDB table's topic, a CDC topic) -- becomes a read-only
sparkiq table, restored from the topic's beginning and kept current by a consumer::

    totals = sparkiq.follow_topic("localhost:9092", "totals", name="totals",
                                  key="user", columns="user STRING, total BIGINT")
    totals.get("totals", "u-1")              # {'user': 'u-1', 'total': 12}
    totals.sql("SELECT count(*) AS n FROM totals WHERE total > 10")

A topic sparkiq published needs no schema: it is read from the ``sparkiq-schemas`` topic.
Formats, placement and positions: :mod:`sparkiq.topics.source`. Reads bounded by a
producer's acknowledgements (``PositionBound.after(...)``) see its records, since every
batch's position is the topic's offsets.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.query.position import KAFKA_PREFIX, Position
from sparkiq.serving.config import NOT_GIVEN, NodeConfig, resolve_group
from sparkiq.serving.handle import QueryableHandle
from sparkiq.serving.hosting import Hosting
from sparkiq.serving.lookup import Lookup
from sparkiq.sql import SqlEngine, SqlLimits
from sparkiq.topics.catalog import TopicCatalog
from sparkiq.topics.lag import TopicLag, topic_lag
from sparkiq.topics.source import TopicSource, TopicSpec

__all__ = [
    "FollowedTopic",
    "TopicSpec",
    "follow_topic",
    "followed_catalogs",
    "parse_topic_spec",
    "topic_spec",
]

_SPEC_OPTIONS = ("key", "columns", "key_format", "value_format", "value_schema")


def follow_topic(
    bootstrap_servers: str,
    topic: str,
    *,
    name: str | None = None,
    key: str | Sequence[str] | None = None,
    columns: str | None = None,
    key_format: str | None = None,
    value_format: str | None = None,
    value_schema: str | Mapping[str, Any] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    local_dir: str | None = None,
    store: str = "rocksdb",
    poll_interval: float = 0.02,
    batch_records: int = 2000,
    schema_interval: float = 30.0,
    sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
    start: bool = True,
) -> FollowedTopic:
    """Serve ``topic`` as table ``name`` (default: the topic's name); see :class:`FollowedTopic`."""
    return FollowedTopic(
        bootstrap_servers,
        topic,
        name=name,
        key=key,
        columns=columns,
        key_format=key_format,
        value_format=value_format,
        value_schema=value_schema,
        kafka_config=kafka_config,
        local_dir=local_dir,
        store=store,
        poll_interval=poll_interval,
        batch_records=batch_records,
        schema_interval=schema_interval,
        sql_limits=sql_limits,
        start=start,
    )


def topic_spec(
    topic: str,
    *,
    name: str | None = None,
    key: str | Sequence[str] | None = None,
    columns: str | None = None,
    key_format: str | None = None,
    value_format: str | None = None,
    value_schema: str | Mapping[str, Any] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
) -> TopicSpec:
    """The :class:`~sparkiq.topics.source.TopicSpec` of :func:`follow_topic`'s arguments."""
    if not isinstance(topic, str) or not topic:
        raise ConfigError(f"topic must be a topic name, got {topic!r}")
    keys = () if key is None else (key,) if isinstance(key, str) else tuple(key)
    return TopicSpec(
        name=name or topic,
        topic=topic,
        key=keys,
        columns=columns,
        key_format=key_format,
        value_format=value_format,
        kafka_config=dict(kafka_config or {}),
        value_schema=_schema_text(value_schema),
    )


def _schema_text(value_schema: str | Mapping[str, Any] | None) -> str | None:
    """An Avro schema given as a dict, as JSON text (a spec is immutable)."""
    if value_schema is None or isinstance(value_schema, str):
        return value_schema
    try:
        return json.dumps(value_schema)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"value_schema: not a JSON Avro schema ({exc})") from None


def parse_topic_spec(text: str) -> TopicSpec:
    """A followed topic as ``sparkiq serve --follow-topic`` takes it:
    ``[NAME=]TOPIC[?key=COLS&columns=DDL&key_format=F&value_format=F&value_schema=S&kafka.SETTING=V]``
    (``key``: key columns, comma-separated; ``columns``: a Spark DDL string, ``+`` or spaces
    between words; ``value_schema``: an Avro schema as JSON, percent-encoded where it holds
    ``&`` or ``+``, or ``@FILE``, a file holding it; ``kafka.SETTING``: a client setting of
    this topic's consumer, over the node's ``--kafka-config``). ConfigError naming the
    problem."""
    head, _, query = text.strip().partition("?")
    name, _, topic = head.rpartition("=")
    options: dict[str, str] = {}
    client: dict[str, str] = {}
    for item in query.split("&") if query else ():
        option, sep, value = item.partition("=")
        if sep and option.startswith("kafka.") and len(option) > len("kafka."):
            client[option[len("kafka.") :]] = urllib.parse.unquote_plus(value)
            continue
        if not sep or option not in _SPEC_OPTIONS:
            raise ConfigError(
                # the spec's other options are not quoted: a kafka.* one may be a secret
                f"--follow-topic {head!r}: {item!r} is not an option; expected "
                f"[NAME=]TOPIC?{'&'.join(f'{o}=...' for o in _SPEC_OPTIONS)}&kafka.SETTING=..."
            )
        if option in options:
            raise ConfigError(f"--follow-topic {head!r}: {option!r} is given twice")
        options[option] = urllib.parse.unquote_plus(value)
    key = options.pop("key", None)
    return topic_spec(
        topic,
        name=name or None,
        key=None if key is None else [k.strip() for k in key.split(",") if k.strip()],
        columns=options.get("columns"),
        key_format=options.get("key_format"),
        value_format=options.get("value_format"),
        value_schema=_schema_option(options.get("value_schema"), text),
        kafka_config=client,
    )


def _schema_option(value: str | None, text: str) -> str | None:
    if value is None or not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise ConfigError(
            f"--follow-topic {text!r}: cannot read value_schema {value}: {exc}"
        ) from None


def followed_catalogs(
    specs: Sequence[TopicSpec], config: NodeConfig, client: Mapping[str, Any]
) -> list[TopicCatalog]:
    """A node's followed topics (none, or one catalog of them), opened now so that a wrong
    topic, schema or format fails the node's construction, clearly; ``client`` (the node's
    Kafka client settings) under each spec's own ``kafka_config``. The node's hosting
    closes them when it closes (and a node started again opens them again)."""
    if not specs:
        return []
    bootstrap_servers, peers = config.kafka_bootstrap, bool(config.peers)
    if not bootstrap_servers:
        raise ConfigError(
            "following Kafka topics needs kafka_bootstrap (--kafka-bootstrap, "
            "SPARKIQ_KAFKA_BOOTSTRAP): the brokers to read them from"
        )
    if peers:
        # every node would read every partition, and the cluster's routing does not place
        # keys by Kafka's partitioner yet: one node serves a followed topic whole
        raise ConfigError(
            "a node with peers cannot follow Kafka topics yet: serve followed topics from a "
            "node of its own (no peers=)"
        )
    specs = [replace(s, kafka_config={**client, **s.kafka_config}) for s in specs]
    return [TopicCatalog(specs, bootstrap_servers)]


class FollowedTopic(QueryableHandle):
    """A read-only table followed from a Kafka topic.

    - ``bootstrap_servers``, ``topic``: where to read; ``kafka_config`` adds consumer
      settings (``security.protocol``, ``sasl.*``...).
    - ``name``: the table's name (default: the topic's; it must be an SQL identifier to be
      queried with SQL).
    - ``columns`` (a Spark DDL string, ``"user STRING, total BIGINT"``) and ``key`` (the key
      columns): the table of a foreign topic; leave both out for a topic sparkiq published
      (its schema is in ``sparkiq-schemas``).
    - ``key_format``: ``"json"`` (default) or ``"kafka"``; ``value_format``: ``"json"``
      (default), ``"string"`` or ``"avro"`` (``"avro-confluent"``, ``"avro-plain"``: one
      framing only; see :mod:`sparkiq.topics.records`).
    - ``value_schema``: the Avro schema the values were written with (JSON text or a dict);
      its record's fields are the columns when ``columns`` is left out
      (:mod:`sparkiq.topics.avrovalues`).
    - ``local_dir``/``store``/``poll_interval``/``sql_limits``/``start``: as
      :func:`sparkiq.attach`'s; the local files are rebuilt from the topic on every open.
    - ``batch_records``: the most records one batch holds (memory is bounded by it).
    - ``schema_interval``: for a topic sparkiq published, how often (seconds) the follower
      checks ``sparkiq-schemas`` for a new schema besides when a record does not fit its
      columns; a new one makes it follow the topic again (:mod:`sparkiq.topics.schemas`).

    The query methods of :class:`~sparkiq.Attached`: :meth:`get`, :meth:`query`,
    :meth:`sql`, :meth:`status`, :meth:`position`. :meth:`wait_caught_up` waits until the
    topic's records of now are applied; :meth:`lag` says how far behind it is. Thread-safe;
    :meth:`close` stops tailing, closes the consumer and the stores.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        name: str | None = None,
        key: str | Sequence[str] | None = None,
        columns: str | None = None,
        key_format: str | None = None,
        value_format: str | None = None,
        value_schema: str | Mapping[str, Any] | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        local_dir: str | None = None,
        store: str = "rocksdb",
        poll_interval: float = 0.02,
        batch_records: int = 2000,
        schema_interval: float = 30.0,
        sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
        start: bool = True,
    ) -> None:
        NodeConfig.resolve(
            "sparkiq-follow-topic", environ={}, store=store, poll_interval=poll_interval
        )
        self._sql_limits: SqlLimits = resolve_group("sql_limits", sql_limits)
        if store == "memory" and local_dir is not None:
            raise ConfigError("local_dir is only used with store='rocksdb'")
        spec = topic_spec(
            topic,
            name=name,
            key=key,
            columns=columns,
            key_format=key_format,
            value_format=value_format,
            value_schema=value_schema,
            kafka_config=kafka_config,
        )
        self.topic = topic
        self.name = spec.name
        self.catalog = TopicCatalog(
            [spec], bootstrap_servers, batch_records=batch_records, schema_interval=schema_interval
        )
        self._sql: SqlEngine | None = None
        self._closed = False
        try:
            self.local_dir = self._local_dir(local_dir, store, prefix=f"sparkiq-topic-{spec.name}-")
            self._hosting = Hosting(
                None,
                node_id=f"topic-{spec.name}",
                placement=lambda _table, count: range(count),
                local_dir=self.local_dir,
                store=store,
                poll_interval=poll_interval,
                catalogs=[self.catalog],
            )
            self._lookup = Lookup(
                self._hosting, node_id=f"topic-{spec.name}", sql_limits=self._sql_limits
            )
            self._hosting.refresh_tables()
        except BaseException:
            self._release()
            self.catalog.close()
            raise
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def poll_once(self) -> int:
        """Read and apply what the topic has now (a few batches at most)."""
        self._require_open()
        return self._hosting.poll_once()

    def close(self) -> None:
        """Stop tailing, close the consumer and the stores; delete a temporary
        ``local_dir``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._release()
        self.catalog.close()

    def _closed_message(self) -> str:
        return f"the followed topic {self.topic!r} is closed"

    # -- what it holds -----------------------------------------------------------------------

    @property
    def source(self) -> TopicSource:
        """The topic source (its counters: ``records``, ``malformed``, ``misplaced``)."""
        return self.catalog.source(self.name)

    def position(self, table: str | None = None) -> Position:
        self._require_open()
        return self._hosting.position(table or self.name)

    def lag(self) -> TopicLag:
        """How far the table is behind the topic, per partition in records and seconds, and
        the records it read, skipped as malformed and found misplaced
        (:mod:`sparkiq.topics.lag`; never blocks)."""
        self._require_open()
        applied = self.position().partition_offsets(KAFKA_PREFIX + self.topic)
        return topic_lag(self.source, applied, time.time())

    def wait_caught_up(self, timeout: float = 60.0) -> bool:
        """Block until every record the topic holds now (its end offsets, as a
        read_committed consumer sees them) is applied by every partition; False on
        timeout."""
        self._require_open()
        deadline = time.monotonic() + timeout
        ends = self.source.end_offsets(timeout=max(1.0, timeout))
        wanted = Position.of_kafka_offsets(self.topic, ends)
        while True:
            # each partition's own position: the merged one dominates as soon as one
            # partition applied the last batch, before the others have
            try:
                held = list(self._hosting.replica(self.name).partitions.values())
            except SparkiqError:  # hosted again meanwhile (a new schema)
                held = []
            if held and all(p.store.position.dominates(wanted) for p in held):
                return True
            if time.monotonic() >= deadline:
                return False
            self._hosting.wake()
            time.sleep(0.02)

    def __repr__(self) -> str:
        return f"FollowedTopic({self.topic!r}, name={self.name!r})"
