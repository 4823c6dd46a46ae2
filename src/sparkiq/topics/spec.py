"""What a node follows: :class:`TopicSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TopicSpec"]


@dataclass(frozen=True)
class TopicSpec:
    """What to follow: ``topic`` as table ``name``. Without ``columns`` the schema comes from
    the ``sparkiq-schemas`` topic (a topic sparkiq published); with them (a Spark DDL
    string), ``key`` names the key columns and ``key_format``/``value_format`` say how the
    records are written (:mod:`sparkiq.topics.records`). ``kafka_config`` adds consumer
    settings (security, client id...). Avro values (``value_format="avro"``) are read with
    ``value_schema``, whose record's fields are the columns unless ``columns`` are given."""

    name: str
    topic: str
    key: tuple[str, ...] = ()
    columns: str | None = None
    key_format: str | None = None
    value_format: str | None = None
    #: never shown by repr: it may hold secrets (sparkiq.topics.consumer)
    kafka_config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: the Avro schema (JSON) of ``value_format="avro"``; its record's fields are the
    #: columns when ``columns`` is None
    value_schema: str | None = None
