"""The tables a node follows from Kafka topics: :class:`TopicCatalog`.

A followed topic is opened again -- a new :class:`~sparkiq.topics.source.TopicSource`, with
a new consumer and a new incarnation, restoring from the topic's beginning -- when its
source stopped reading because its published schema changed (:mod:`sparkiq.topics.schemas`)
or was closed (a node stopped, then started again). The node's hosting sees the new
incarnation at its next refresh (about a second), releases the table's replicas and hosts
the new source's; until then the old replicas serve the rows they hold, at their position.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.topics.source import TopicSource, TopicSpec

__all__ = ["TopicCatalog"]

log = logging.getLogger("sparkiq.topic")

#: How long after a failed reopening the catalog tries again.
RETRY_SECONDS = 10.0


class TopicCatalog:
    """The tables a node follows from Kafka topics, each a :class:`TopicSource` opened at
    construction (a wrong topic, schema or format fails here, clearly), and opened again
    when it went stale or was closed (see the module docstring). ``options`` are
    :class:`TopicSource`'s. Thread-safe."""

    def __init__(self, specs: Sequence[TopicSpec], bootstrap_servers: str, **options: Any) -> None:
        names = [s.name for s in specs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"followed topics name tables {repeated} twice: give each its own")
        self.bootstrap_servers = bootstrap_servers
        self._options = options
        self._sources: dict[str, TopicSource] = {}
        self._failed_at: dict[str, float] = {}
        self._lock = threading.Lock()  # guards reopening
        try:
            for spec in specs:
                self._sources[spec.name] = TopicSource(spec, bootstrap_servers, **options)
        except BaseException:
            self.close()
            raise

    def names(self) -> list[str]:
        """The tables, after opening again any source that went stale or was closed."""
        for name in sorted(self._sources):
            self._renew(name)
        return sorted(self._sources)

    def _renew(self, name: str) -> TopicSource:
        with self._lock:
            return self._renewed(name)

    def _renewed(self, name: str) -> TopicSource:
        old = self._sources[name]
        if old.stale is None and not old.closed:
            return old
        if time.monotonic() - self._failed_at.get(name, -RETRY_SECONDS) < RETRY_SECONDS:
            return old
        why = "it was closed" if old.stale is None else old.stale
        try:
            new = TopicSource(old.spec, self.bootstrap_servers, **self._options)
        except SparkiqError as exc:
            self._failed_at[name] = time.monotonic()
            log.error(
                "topic %r (table %r): cannot follow it again after %s: %s; the table keeps "
                "its rows; retrying in %g s",
                old.topic,
                name,
                why,
                exc.message,
                RETRY_SECONDS,
            )
            return old
        log.info("topic %r (table %r): following it again (%s)", old.topic, name, why)
        self._failed_at.pop(name, None)
        self._sources[name] = new
        old.close()
        return new

    def open(self, name: str) -> TopicSource:
        try:
            self._sources[name]
        except KeyError:
            raise ConfigError(f"no followed topic is served as table {name!r}") from None
        return self._renew(name)

    def incarnation(self, name: str) -> str | None:
        source = self._sources.get(name)
        return None if source is None else source.manifest().incarnation

    def source(self, name: str) -> TopicSource:
        """The current source of table ``name`` (not opened again here)."""
        try:
            return self._sources[name]
        except KeyError:
            raise ConfigError(f"no followed topic is served as table {name!r}") from None

    def sources(self) -> list[TopicSource]:
        """The followed topics' current sources, by table name."""
        return [self._sources[name] for name in sorted(self._sources)]

    def close(self) -> None:
        """Close every source (asked for its tables again, the catalog opens them anew)."""
        for source in self._sources.values():
            source.close()

    def __repr__(self) -> str:
        return f"TopicCatalog({self.bootstrap_servers!r}, {sorted(self._sources)})"
