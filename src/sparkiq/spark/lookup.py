"""Lookups into a followed table from another Spark pipeline.

::

    enriched = sparkiq.spark.enrich(orders, "/data/shop", "revenue_by_product",
                                    key="product", columns=["revenue"], prefix="p_")

``enriched`` is ``orders`` plus ``p_revenue`` (null where the table has no row for the key)
plus ``sparkiq_batch``: the batch of the table, as the follower had applied it, that the
row's lookup read. It works on batch and streaming DataFrames alike.

How: a ``mapInArrow`` whose function keeps one :class:`~sparkiq.serving.follower.Follower`
per executor Python process (a module-level cache keyed by state_dir, table, columns and
local_dir), projected to the looked-up columns. A worker's first task restores it from the
changelog; later tasks reuse it. Before each Arrow batch the follower applies every batch
committed so far, so a lookup never reads a state older than what the owner had committed
when that Arrow batch started; each row reports the batch its key's partition was at.

Executors must be able to read ``state_dir`` (it is read-only for them) and have sparkiq
installed. With ``local_dir=None`` the followers keep the table in memory (restored again
by each new worker process); with a ``local_dir`` they keep it in RocksDB under
``<local_dir>/slot-<n>`` (one slot per concurrent worker process on a machine, claimed
with a file lock) and resume from it when a worker restarts.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from sparkiq.changelog import Changelog
from sparkiq.errors import ConfigError
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.sparkarrow import stored_to_arrow
from sparkiq.schema.types import DataType, parse_type
from sparkiq.serving.follower import Follower
from sparkiq.spark.datasource import BATCH_COLUMN
from sparkiq.spark.sink import absolute_location

__all__ = ["BATCH_COLUMN", "enrich"]


def enrich(
    df: Any,
    state_dir: str,
    table: str,
    *,
    key: str | Sequence[str],
    columns: Sequence[str] | None = None,
    prefix: str = "",
    local_dir: str | None = None,
) -> Any:
    """``df`` plus the row of each event's key in ``table``, looked up in a follower.

    ``key`` names the column(s) of ``df`` holding the key, in the table's key-column order;
    their types must be the key columns' types (a narrower integer type is accepted).
    ``columns`` are the table columns to add (default: every non-key column), named
    ``prefix + column``; they are nullable and null where the table has no row for the key
    (or the key is null: like a join, a null key matches nothing). :data:`BATCH_COLUMN`
    (long) is the batch the lookup read. Raises :class:`ConfigError` naming the problem.
    """
    from pyspark.sql.types import LongType, StructField, StructType

    # Resolved here, on the driver: executors run in working directories of their own.
    state_dir = absolute_location(state_dir)
    local_dir = None if local_dir is None else absolute_location(local_dir)
    manifest = Changelog(state_dir, table, read_only=True).manifest()
    schema = manifest.schema
    if schema.window_column is not None:
        raise ConfigError(
            f"table {table!r} is windowed: a key has several rows, one per window, so it "
            "cannot be looked up by key alone",
            store=table,
        )
    key_columns = (key,) if isinstance(key, str) else tuple(key)
    if len(key_columns) != len(schema.key_columns):
        raise ConfigError(
            f"table {table!r} has {len(schema.key_columns)} key columns "
            f"{list(schema.key_columns)}; key= names {list(key_columns)}",
            store=table,
        )
    events = {f.name: f.type for f in parse_type(json.loads(df.schema.json())).fields}
    for name, column in zip(key_columns, schema.key_columns, strict=True):
        if name not in events:
            raise ConfigError(
                f"key= names {name!r}, which is not a column of the DataFrame; its columns "
                f"are {list(events)}",
                store=table,
            )
        wanted, got = schema.field(column).type, events[name]
        if not _fits(got, wanted):
            raise ConfigError(
                f"column {name!r} is {got.simple_string()} but key column {column!r} of "
                f"{table!r} is {wanted.simple_string()}: cast it "
                f"(F.col({name!r}).cast({wanted.simple_string()!r}))",
                store=table,
            )
    if columns is None:
        columns = [c for c in schema.column_names if c not in schema.key_columns]
    looked_up = list(columns)
    unknown = [c for c in looked_up if c not in schema.column_names]
    if unknown:
        raise ConfigError(
            f"table {table!r} has no column {unknown[0]!r}; its columns are "
            f"{list(schema.column_names)}",
            store=table,
        )
    names = [prefix + c for c in looked_up]
    clashes = sorted({*names, BATCH_COLUMN} & set(df.columns))
    if clashes or len(set(names)) != len(names):
        raise ConfigError(
            f"the looked-up columns {names} would clash with the DataFrame's columns "
            f"{clashes}: pass prefix= (e.g. prefix={table + '_'!r})",
            store=table,
        )
    added = StructType.fromJson(
        {"type": "struct", "fields": [schema.field(c).to_json() for c in looked_up]}
    )
    output = StructType(
        [
            *df.schema.fields,
            *(StructField(n, f.dataType, True) for n, f in zip(names, added.fields, strict=True)),
            StructField(BATCH_COLUMN, LongType(), True),
        ]
    )
    lookup = _Lookup(state_dir, table, key_columns, tuple(looked_up), tuple(names), local_dir)
    return df.mapInArrow(lookup, output)


def _fits(event: DataType, key: DataType) -> bool:
    narrow, wide = KINDS.get(event.name), KINDS.get(key.name)
    if narrow and wide and narrow.integral and wide.integral:
        return narrow.bits <= wide.bits
    return event == key


class _Lookup:
    """The ``mapInArrow`` function (pickled to executors by reference to this class)."""

    def __init__(
        self,
        state_dir: str,
        table: str,
        key: tuple[str, ...],
        columns: tuple[str, ...],
        names: tuple[str, ...],
        local_dir: str | None,
    ) -> None:
        self.state_dir, self.table, self.key = state_dir, table, key
        self.columns, self.names, self.local_dir = columns, names, local_dir

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        follower = _follower(self.state_dir, self.table, self.columns, self.local_dir)
        kept = follower.schema
        indices = [kept.column_names.index(c) for c in self.columns]
        types = [kept.field(c).type for c in self.columns]
        decode = msgspec.msgpack.Decoder().decode
        table, single = self.table, len(self.key) == 1
        for batch in batches:
            follower.poll_once()  # at least as fresh as the owner's last commit
            keys = [batch.column(name).to_pylist() for name in self.key]
            rows = batch.num_rows
            found: list[list[Any]] = [[None] * rows for _ in indices]
            read_at: list[int | None] = [None] * rows
            for i in range(rows):
                if single:
                    value = keys[0][i]
                    if value is None:
                        continue
                else:
                    value = tuple(column[i] for column in keys)
                    if None in value:
                        continue
                raw, position = follower.get_encoded(value)
                read_at[i] = next(iter(position.partition_offsets(table).values()), -1)
                if raw is not None:
                    stored = decode(raw)
                    for out, index in zip(found, indices, strict=True):
                        out[i] = stored[index]
            arrays = [
                *batch.columns,
                *(stored_to_arrow(v, t) for v, t in zip(found, types, strict=True)),
                pa.array(read_at, pa.int64()),
            ]
            yield pa.RecordBatch.from_arrays(
                arrays, names=[*batch.schema.names, *self.names, BATCH_COLUMN]
            )


# -- one follower per process ------------------------------------------------------------------

_FOLLOWERS: dict[tuple[str, str, tuple[str, ...], str | None], Follower] = {}
_LOCK = threading.Lock()
_SLOTS: list[int] = []  # lock file descriptors held for the life of the process


def _follower(
    state_dir: str, table: str, columns: tuple[str, ...], local_dir: str | None
) -> Follower:
    cache_key = (state_dir, table, columns, local_dir)
    with _LOCK:
        follower = _FOLLOWERS.get(cache_key)
        if follower is None:
            if not _FOLLOWERS:
                atexit.register(_close_all)
            follower = Follower(
                state_dir,
                table,
                columns=columns,
                local_dir=None if local_dir is None else _claim_slot(local_dir),
                store="memory" if local_dir is None else "rocksdb",
                start=False,
            )
            follower.poll_once()  # restore before the first lookup, then tail in background
            follower.start()
            _FOLLOWERS[cache_key] = follower
        return follower


def _claim_slot(base: str) -> str:
    """A directory under ``base`` no other live process uses (RocksDB allows one process
    per database); the lock is released by the OS when the process exits."""
    import fcntl  # POSIX only, like Spark's Python workers; imported here to keep
    # `import sparkiq` working everywhere

    for slot in itertools.count():
        path = os.path.join(base, f"slot-{slot:03d}")
        os.makedirs(path, exist_ok=True)
        fd = os.open(os.path.join(path, ".lock"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _SLOTS.append(fd)
        return path
    raise AssertionError("unreachable")


def _close_all() -> None:
    with _LOCK:
        for follower in _FOLLOWERS.values():
            follower.close()
        _FOLLOWERS.clear()
