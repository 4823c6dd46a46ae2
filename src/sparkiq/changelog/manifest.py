"""Table manifests: the fixed layout of a materialized table.

On-disk format, version 1 (``tables/<table>/table.json``): a JSON object with
``format = "table"``, ``layout_version``, ``name``, ``key_columns``, ``window_column``,
``partitions``, ``schema`` (Spark's ``StructType.json()`` of the materialized DataFrame),
``schema_version``, ``tombstone_column``, ``output_mode``, ``incarnation`` (a random id
chosen when the table is first created; replicas compare it with the one they were built
from, so a changelog deleted and recreated under the same name is never mixed with an old
replica's local state) and ``history`` (``{"batches": n, "seconds": s}``: how many past
batches replicas keep readable; absent in older manifests, which get the default).
``partitioning`` (absent: ``"spark"``, Spark's hash partitioning of the key columns) names
how keys are placed in partitions otherwise: ``"kafka-murmur2-<key format>"`` for a table
followed from a Kafka topic (:mod:`sparkiq.topics.keys`; such manifests live in memory only).

The layout (key columns, window column, partition count, schema) fixes how every segment of
the table was written, so it can never change under an existing changelog: materializing a
table whose layout differs from its manifest raises :class:`LayoutMismatchError` naming each
difference, and writes nothing. The history is not layout: materializing with another one
rewrites the manifest, and replicas use it from their next start.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from sparkiq.changelog.storage import Storage
from sparkiq.errors import ChangelogError, LayoutMismatchError
from sparkiq.schema.types import TableSchema
from sparkiq.stores.history import DEFAULT_HISTORY, History

__all__ = ["LAYOUT_VERSION", "OUTPUT_MODES", "TableManifest"]

LAYOUT_VERSION = 1
# Spark output modes a table's query may run in (``output_mode``); ``complete`` rewrites the
# whole table every batch, which readers of the changelog must know.
OUTPUT_MODES = ("update", "append", "complete")


@dataclass(frozen=True)
class TableManifest:
    """The layout of one table; see the module docstring for the file format."""

    name: str
    schema: TableSchema
    partitions: int
    output_mode: str = "update"
    tombstone_column: str | None = None
    schema_version: int = 1
    incarnation: str = ""
    history: History = DEFAULT_HISTORY
    partitioning: str = "spark"

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.schema.key_columns

    @property
    def window_column(self) -> str | None:
        return self.schema.window_column

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "table",
            "layout_version": LAYOUT_VERSION,
            "name": self.name,
            "key_columns": list(self.schema.key_columns),
            "window_column": self.schema.window_column,
            "partitions": self.partitions,
            "schema": json.loads(self.schema.spark_json()),
            "schema_version": self.schema_version,
            "tombstone_column": self.tombstone_column,
            "output_mode": self.output_mode,
            "incarnation": self.incarnation,
            "history": self.history.to_json(),
            **({} if self.partitioning == "spark" else {"partitioning": self.partitioning}),
        }

    def encode(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    @staticmethod
    def decode(data: bytes, path: str) -> TableManifest:
        try:
            doc = json.loads(data)
            if doc.get("format") != "table":
                raise ValueError("not a sparkiq table manifest")
            if int(doc["layout_version"]) > LAYOUT_VERSION:
                raise ChangelogError(
                    f"{path!r} has layout version {doc['layout_version']}; this sparkiq reads "
                    f"up to {LAYOUT_VERSION}: upgrade sparkiq"
                )
            schema = TableSchema.from_spark_json(
                doc["schema"], doc["key_columns"], doc.get("window_column")
            )
            return TableManifest(
                name=str(doc["name"]),
                schema=schema,
                partitions=int(doc["partitions"]),
                output_mode=str(doc.get("output_mode", "update")),
                tombstone_column=doc.get("tombstone_column"),
                schema_version=int(doc.get("schema_version", 1)),
                incarnation=str(doc.get("incarnation", "")),
                history=History.from_json(doc["history"]) if "history" in doc else DEFAULT_HISTORY,
                partitioning=str(doc.get("partitioning", "spark")),
            )
        except ChangelogError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise ChangelogError(f"cannot read table manifest {path!r}: {exc}") from exc

    def differences(self, other: TableManifest) -> list[str]:
        """Human-readable differences in layout between two manifests of the same table."""
        diffs = []
        if self.schema.key_columns != other.schema.key_columns:
            diffs.append(f"key columns {list(other.key_columns)} != {list(self.key_columns)}")
        if self.schema.window_column != other.schema.window_column:
            diffs.append(f"window column {other.window_column!r} != {self.window_column!r}")
        if self.partitions != other.partitions:
            diffs.append(f"partitions {other.partitions} != {self.partitions}")
        if self.schema.fields != other.schema.fields:
            mine = {f.name: f.type.simple_string() for f in self.schema.fields}
            theirs = {f.name: f.type.simple_string() for f in other.schema.fields}
            diffs.append(f"schema {theirs} != {mine}")
        if self.tombstone_column != other.tombstone_column:
            diffs.append(
                f"tombstone column {other.tombstone_column!r} != {self.tombstone_column!r}"
            )
        if self.output_mode != other.output_mode:
            diffs.append(f"output mode {other.output_mode!r} != {self.output_mode!r}")
        return diffs

    def ensure_written(self, storage: Storage, path: str) -> TableManifest:
        """Write this manifest, or check it equals the one already there; return what is there.

        Raises :class:`LayoutMismatchError` (and writes nothing) when ``path`` holds a
        manifest with another layout.
        """
        if storage.exists(path):
            existing = TableManifest.decode(storage.read_bytes(path), path)
            diffs = existing.differences(self)
            if diffs:
                raise LayoutMismatchError(
                    f"table {self.name!r} in {path!r} was created with another layout: "
                    + "; ".join(f"requested {d} (existing)" for d in diffs)
                    + ". Materialize under a new name, or delete the table's directory to "
                    "start it over.",
                    store=self.name,
                )
            if existing.history != self.history:
                existing = replace(existing, history=self.history)
                storage.write_atomic(path, existing.encode())
            return existing
        created = replace(self, incarnation=self.incarnation or uuid.uuid4().hex)
        storage.write_atomic(path, created.encode())
        return created
