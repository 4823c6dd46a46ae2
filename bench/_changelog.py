"""Writing a table's changelog by hand, as the sink does, without Spark.

The benchmarks that do not measure Spark build their tables with this: rows are encoded
with the table's own codecs and partitioned with the same :class:`Partitioner` the sink's
``pmod(hash(key), P)`` matches, so a :class:`~sparkiq.Node` reads them exactly as it reads
a Spark-written changelog.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

from sparkiq import Node
from sparkiq.changelog import Changelog, CommitRecord, TableManifest
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema

#: A typical aggregation row: a string key, a count and a sum.
SCHEMA_JSON = {
    "type": "struct",
    "fields": [
        {"name": "k", "type": "string", "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
        {"name": "total", "type": "double", "nullable": True, "metadata": {}},
    ],
}

Changes = dict[int, dict[bytes, bytes | None]]


def key_name(i: int) -> str:
    return f"key-{i:08d}"


class HandWrittenTable:
    """One table (``k string`` key, ``n long``, ``total double``) in ``state_dir``."""

    def __init__(self, state_dir: str, name: str, partitions: int = 8) -> None:
        schema = TableSchema.from_spark_json(SCHEMA_JSON, ["k"])
        manifest = TableManifest(name=name, schema=schema, partitions=partitions)
        self.changelog = Changelog(state_dir, name)
        self.manifest = manifest.ensure_written(
            self.changelog.storage, self.changelog.manifest_path
        )
        self.name = name
        self.partitions = partitions
        self.keys = KeyCodec(schema)
        self.rows = RowCodec(schema)
        self.partitioner = Partitioner(schema.key_types, partitions)
        self._partition_of: dict[str, int] = {}

    def partition_of(self, key: str) -> int:
        found = self._partition_of.get(key)
        if found is None:
            found = self._partition_of[key] = self.partitioner(self.keys.to_internal(key))
        return found

    def encode(self, keys: Sequence[str], ns: Sequence[int], totals: Sequence[float]) -> Changes:
        """The rows ``(k, n, total)`` as encoded changes, grouped by partition."""
        table = pa.table(
            {
                "k": pa.array(keys, pa.string()),
                "n": pa.array(ns, pa.int64()),
                "total": pa.array(totals, pa.float64()),
            }
        )
        changes: Changes = {}
        encoded_keys = self.keys.encode_arrow(table)
        values = self.rows.encode_arrow(table)
        for key, encoded, value in zip(keys, encoded_keys, values, strict=True):
            changes.setdefault(self.partition_of(key), {})[encoded] = value
        return changes

    def write_batch(self, batch_id: int, changes: Changes) -> CommitRecord:
        """Write the segments, then the commit record, of batch ``batch_id``."""
        segments = {
            p: self.changelog.write_segment(p, batch_id, c) for p, c in changes.items() if c
        }
        record = CommitRecord(
            table=self.name,
            batch_id=batch_id,
            mode="update",
            segments=segments,
            committed_at=time.time(),
        )
        self.changelog.write_commit(record)
        return record


@contextlib.contextmanager
def caught_up_node(state_dir: str, partitions: int) -> Iterator[Node]:
    """A :class:`~sparkiq.Node` over the tables in ``state_dir`` that has applied every
    committed batch (checked: one poll applied ``partitions`` partitions); stopped on exit."""
    node = Node(state_dir)
    try:
        node.refresh_tables()
        applied = node.poll_once()
        assert applied == partitions, (applied, partitions)
        yield node
    finally:
        node.stop()
