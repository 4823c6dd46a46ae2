"""A materialized table's publisher to Kafka, run by the App in the driver process.

``App.materialize(..., kafka_topic="name")`` (or ``WITH (KAFKA_TOPIC = 'name')`` in SQL)
declares that a table is published; :class:`PublishSpec` is that declaration, checked when
the table is declared. When the table's query starts the App starts a
:class:`~sparkiq.publish.publisher.TablePublisher` on a background thread of the driver
(the App's process: under Spark Connect, the client's), which follows the table's commits
in the changelog. It never runs in the ``foreachBatch`` function: the sink carries plain
data only, and the publisher's Kafka producer, its transactions and its status are
driver-side state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkiq.changelog import TableManifest
from sparkiq.errors import ConfigError
from sparkiq.publish.publisher import TablePublisher
from sparkiq.publish.records import RecordEncoder

__all__ = ["BOOTSTRAP_VARIABLE", "PublishSpec", "publish_spec"]

#: Where the brokers come from when neither materialize() nor the App names them.
BOOTSTRAP_VARIABLE = "SPARKIQ_KAFKA_BOOTSTRAP"


@dataclass(frozen=True)
class PublishSpec:
    """Publish a table to ``topic`` with the Kafka client ``config`` in ``key_format``."""

    topic: str
    config: Mapping[str, Any] = field(default_factory=dict)
    key_format: str = "json"

    def publisher(self, state_dir: str, table: str) -> TablePublisher:
        """The table's publisher (not started): its manifest must be written."""
        return TablePublisher(state_dir, table, self.topic, self.config, key_format=self.key_format)


def publish_spec(
    manifest: TableManifest,
    topic: str | None,
    config: Mapping[str, Any] | None,
    default_config: Mapping[str, Any] | None,
    key_format: str,
) -> PublishSpec | None:
    """Check a table's publishing options (None: not published). ``config`` overrides the
    App's ``default_config``; ``bootstrap.servers`` comes from :data:`BOOTSTRAP_VARIABLE`
    when neither has it. Raises :class:`ConfigError` naming what is wrong."""
    name = manifest.name
    if topic is None:
        if config is not None or key_format != "json":
            raise ConfigError(
                f"kafka_config or a key format is given for table {name!r} but no kafka_topic "
                "(KAFKA_TOPIC in SQL) to publish it to: add kafka_topic='name', or leave them "
                "out",
                store=name,
            )
        return None
    if not isinstance(topic, str) or not topic.strip() or len(topic) > 249:
        raise ConfigError(
            f"kafka_topic of table {name!r} must be a topic name (1-249 characters), got {topic!r}",
            store=name,
        )
    for given in (config, default_config):
        if given is not None and not isinstance(given, Mapping):
            raise ConfigError(
                "kafka_config must be a dict of Kafka client settings such as "
                f"{{'bootstrap.servers': 'host:9092'}}, got {type(given).__name__}",
                store=name,
            )
    merged = {**(default_config or {}), **(config or {})}
    if not merged.get("bootstrap.servers"):
        from_env = os.environ.get(BOOTSTRAP_VARIABLE)
        if not from_env:
            raise ConfigError(
                f"table {name!r} is published to Kafka topic {topic!r} but no brokers are "
                "given: pass kafka_config={'bootstrap.servers': 'host:9092'} (to materialize() "
                f"or App()), or set {BOOTSTRAP_VARIABLE}",
                store=name,
            )
        merged["bootstrap.servers"] = from_env
    RecordEncoder(manifest, key_format)  # refuses a key format the table cannot take
    return PublishSpec(topic, merged, key_format)
