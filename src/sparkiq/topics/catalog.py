"""The tables a node follows from Kafka topics: :class:`TopicCatalog`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkiq.errors import ConfigError
from sparkiq.topics.source import TopicSource, TopicSpec

__all__ = ["TopicCatalog"]


class TopicCatalog:
    """The tables a node follows from Kafka topics, each a :class:`TopicSource` opened once
    (at construction: a wrong topic, schema or format fails here, clearly)."""

    def __init__(self, specs: Sequence[TopicSpec], bootstrap_servers: str, **options: Any) -> None:
        names = [s.name for s in specs]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"followed topics name tables {repeated} twice: give each its own")
        self.bootstrap_servers = bootstrap_servers
        self._sources: dict[str, TopicSource] = {}
        try:
            for spec in specs:
                self._sources[spec.name] = TopicSource(spec, bootstrap_servers, **options)
        except BaseException:
            self.close()
            raise

    def names(self) -> list[str]:
        return sorted(self._sources)

    def open(self, name: str) -> TopicSource:
        try:
            return self._sources[name]
        except KeyError:
            raise ConfigError(f"no followed topic is served as table {name!r}") from None

    def incarnation(self, name: str) -> str | None:
        source = self._sources.get(name)
        return None if source is None else source.manifest().incarnation

    def source(self, name: str) -> TopicSource:
        return self.open(name)

    def sources(self) -> list[TopicSource]:
        """The followed topics' sources, by table name."""
        return [self._sources[name] for name in sorted(self._sources)]

    def close(self) -> None:
        for source in self._sources.values():
            source.close()

    def __repr__(self) -> str:
        return f"TopicCatalog({self.bootstrap_servers!r}, {self.names()})"
