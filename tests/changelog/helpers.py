"""Writing a changelog by hand, the way the sink does, without Spark."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from sparkiq.changelog import Changelog, CommitRecord, TableManifest
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema

SCHEMA_JSON = {
    "type": "struct",
    "fields": [
        {"name": "k", "type": "string", "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
    ],
}


def make_table(
    state_dir: str, name: str = "t", partitions: int = 4, mode: str = "update"
) -> Changelog:
    schema = TableSchema.from_spark_json(SCHEMA_JSON, ["k"])
    manifest = TableManifest(name=name, schema=schema, partitions=partitions, output_mode=mode)
    changelog = Changelog(state_dir, name)
    manifest.ensure_written(changelog.storage, changelog.manifest_path)
    return changelog


def write_batch(
    changelog: Changelog,
    batch_id: int,
    rows: dict[str, int | None],
    *,
    commit: bool = True,
    position: dict[str, dict[int, int]] | None = None,
) -> CommitRecord:
    """Write ``{key: n}`` (None deletes the key) as batch ``batch_id``."""
    manifest = changelog.manifest()
    keys, codec = KeyCodec(manifest.schema), RowCodec(manifest.schema)
    partitioner = Partitioner(manifest.schema.key_types, manifest.partitions)
    by_partition: dict[int, dict[bytes, bytes | None]] = {}
    for key, n in rows.items():
        internal = keys.to_internal(key)
        value = None
        if n is not None:
            value = codec.encode_arrow(pa.table({"k": [key], "n": pa.array([n], pa.int64())}))[0]
        by_partition.setdefault(partitioner(internal), {})[keys.encode(internal)] = value
    segments = {p: changelog.write_segment(p, batch_id, c) for p, c in by_partition.items()}
    record = CommitRecord(
        table=changelog.table,
        batch_id=batch_id,
        mode=manifest.output_mode,
        segments=segments,
        position=position or {},
        committed_at=time.time(),
    )
    if commit:
        changelog.write_commit(record)
    return record


def expected_rows(history: list[dict[str, int | None]]) -> dict[str, dict[str, Any]]:
    state: dict[str, dict[str, Any]] = {}
    for batch in history:
        for key, n in batch.items():
            if n is None:
                state.pop(key, None)
            else:
                state[key] = {"k": key, "n": n}
    return state
