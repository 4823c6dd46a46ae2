"""Helpers for the checkpoint tests: real streaming queries over a JSON file source, run one
micro-batch at a time, and Spark's own State Data Source as the ground truth."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkiq.checkpoint import Checkpoint, RowDecoder, StateStoreInfo, replay, version_of_batch


@contextlib.contextmanager
def sql_conf(spark: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """Session SQL settings for the block, restored after (other tests share the session)."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class Stream:
    """A stateful query over JSON files in ``<tmp>/src``, checkpointed in ``<tmp>/ck``;
    :meth:`batch` writes one file and runs the query until it has processed it."""

    def __init__(
        self,
        spark: Any,
        tmp: Path,
        schema: str,
        build: Callable[[Any], Any],
        *,
        output_mode: str = "update",
        conf: Mapping[str, str] | None = None,
    ) -> None:
        self.spark, self.schema, self.build = spark, schema, build
        self.source = tmp / "src"
        self.source.mkdir(parents=True)
        self.checkpoint = tmp / "ck"
        self.output_mode = output_mode
        self.conf = dict(conf or {})
        self.files = 0

    def batch(self, rows: Sequence[Mapping[str, Any]]) -> None:
        path = self.source / f"{self.files:04d}.json"
        self.files += 1
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with sql_conf(self.spark, self.conf):
            frame = self.build(self.spark.readStream.schema(self.schema).json(str(self.source)))
            query = (
                frame.writeStream.format("noop")
                .outputMode(self.output_mode)
                .option("checkpointLocation", str(self.checkpoint))
                .queryName(f"ck_{uuid.uuid4().hex[:8]}")
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            assert query.exception() is None, query.exception()


def plain(value: Any) -> Any:
    """A collected value as sparkiq gives it: nested Rows and maps as dicts, lists as lists."""
    if hasattr(value, "__fields__"):
        return {name: plain(v) for name, v in zip(value.__fields__, value, strict=True)}
    if isinstance(value, dict):
        return {plain_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def plain_key(key: Any) -> Any:
    if hasattr(key, "__fields__"):
        return tuple(plain_key(v) for v in key)
    return plain(key)


def row_tuple(row: Any) -> tuple[Any, ...]:
    return tuple(plain(v) for v in row)


def spark_state(spark: Any, checkpoint: Path, batch: int, **options: Any) -> set[Any]:
    """``{(partition, key tuple, value tuple)}`` of Spark's State Data Source at ``batch``."""
    reader = spark.read.format("statestore").option("batchId", batch)
    for name, value in options.items():
        reader = reader.option(name, value)
    rows = reader.load(str(checkpoint)).collect()
    return {
        (r.partition_id, hashable(row_tuple(r.key)), hashable(row_tuple(r.value))) for r in rows
    }


def sparkiq_state(ck: Checkpoint, store: StateStoreInfo, batch: int) -> set[Any]:
    """The same set, decoded by sparkiq from the store's files (snapshot + deltas)."""
    decoder = RowDecoder(store)
    found = set()
    for partition in range(store.partitions):
        state = replay(ck.files(store, partition), version_of_batch(batch))
        for key, value in state.items():
            k, v = decoder.row(key, value)
            found.add((partition, hashable(k), hashable(v)))
    return found


def hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, hashable(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    return value
