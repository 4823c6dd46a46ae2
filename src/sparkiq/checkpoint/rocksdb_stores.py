"""Opening one store of Spark's RocksDB state store provider from its description.

:class:`~sparkiq.checkpoint.layout.Checkpoint` describes each store it discovers in a
:class:`~sparkiq.checkpoint.provider.StateStoreInfo`; :func:`open_state_files` (what
``Checkpoint.files`` calls for this provider) turns that into the reader of one partition: a
:class:`~sparkiq.checkpoint.rocksdb.RocksDBStateFiles` framed as the store's operator and
settings say, or for a transformWithState variable (:func:`open_state_variable`) its list or
map view from :mod:`sparkiq.checkpoint.tws`. :func:`commit_log_ids` tells a reader which
attempt of a retried batch was committed (``checkpointFormatVersion=2``).

Refused by name, never read into a wrong row: row checksums
(``spark.sql.streaming.stateStore.rowChecksum.enabled``) and Spark's internal column families.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkiq.checkpoint.framing import RocksDBEncoding
from sparkiq.checkpoint.logs import read_commit
from sparkiq.checkpoint.provider import DEFAULT_STORE, StateStoreInfo
from sparkiq.checkpoint.rocksdb import RocksDBStateFiles, UnsupportedStateFormatError
from sparkiq.checkpoint.tws import ListStateFiles, MapStateFiles, StateVariableKind
from sparkiq.errors import ChangelogError
from sparkiq.schema.types import DataType, parse_type

__all__ = ["commit_log_ids", "open_state_files", "open_state_variable"]


def open_state_variable(
    directory: str | os.PathLike[str],
    kind: StateVariableKind,
    *,
    column_family: str,
    key_schema: DataType,
    row_format: str = "unsaferow",
    value_schema: DataType | None = None,
    key_schema_id: int = 0,
    value_schema_id: int = 0,
    name: str = "",
    partition: int | None = None,
    store: str | None = None,
    codec: str = "lz4",
    local_dir: str | None = None,
    committed_ids: Callable[[int], frozenset[str] | None] | None = None,
) -> RocksDBStateFiles | ListStateFiles | MapStateFiles:
    """``StateFiles`` of one transformWithState variable in one partition directory,
    serving the rows :func:`sparkiq.checkpoint.tws.served_schemas` describes. ``key_schema``
    and ``value_schema`` are Spark's schemas of the variable's column family (``_stateSchema``
    v3; the value schema and the schema ids are needed for ``row_format="avro"`` only)."""
    if column_family.startswith("$"):
        raise ChangelogError(
            f"{name or column_family}: column family {column_family!r} is Spark's internal "
            "bookkeeping (row counters, TTL index, timers), not a state variable",
            store=store,
            partition=partition,
        )
    encoding = RocksDBEncoding(
        key_schema,
        column_family=column_family,
        prefix_columns=1 if kind == "map" else 0,
        multi_value=kind == "list",
        row_format=row_format,
        value_schema=value_schema,
        key_schema_id=key_schema_id,
        value_schema_id=value_schema_id,
    )
    files = RocksDBStateFiles(
        directory,
        encoding,
        name=name,
        partition=partition,
        store=store,
        codec=codec,
        local_dir=local_dir,
        committed_ids=committed_ids,
    )
    if kind == "list":
        return ListStateFiles(files, key_schema)
    if kind == "map":
        return MapStateFiles(files, key_schema)
    return files


_ROW_CHECKSUM = "spark.sql.streaming.stateStore.rowChecksum.enabled"
_ENCODING_FORMAT = "spark.sql.streaming.stateStore.encodingFormat"


def open_state_files(
    store: StateStoreInfo, partition: int
) -> RocksDBStateFiles | ListStateFiles | MapStateFiles:
    """The files of ``store``'s ``partition`` (what ``Checkpoint.files`` calls): a whole
    RocksDB store, or one transformWithState variable when ``store.schema_json`` describes
    its column family (``ColumnFamily.spec_json``). The query's ``encodingFormat`` applies to
    the column families of a v3 state schema (transformWithState); Spark keeps the other
    operators' stores in UnsafeRows whatever it says."""
    name = store.describe()
    if store.setting(_ROW_CHECKSUM).lower() == "true":
        raise UnsupportedStateFormatError(
            f"{store.describe(partition)}: the query writes row checksums ({_ROW_CHECKSUM}"
            "=true), which sparkiq does not read yet; turn the setting off for this query",
            store=store.store_name,
            partition=partition,
        )
    row_format = store.setting(_ENCODING_FORMAT, "unsaferow") or "unsaferow"
    directory = store.directory(partition)
    common: dict[str, Any] = {
        "name": name,
        "partition": partition,
        "store": store.store_name,
        "codec": store.codec,
        "committed_ids": commit_log_ids(store.checkpoint, store.operator_id, partition),
    }
    if not store.schema_json:
        prefix = store.num_cols_prefix_key
        encoding = RocksDBEncoding(store.key_schema, prefix_columns=prefix)
        return RocksDBStateFiles(directory, encoding, **common)
    doc = json.loads(store.schema_json)
    spec = doc.get("keyStateEncoderSpec") or {}
    encoder = str(spec.get("keyStateEncoderType", "NoPrefixKeyStateEncoderSpec"))
    kind = doc.get("stateVariableKind")
    key_schema = parse_type(doc["keySchema"])
    avro: dict[str, Any] = {
        "row_format": row_format,
        "value_schema": parse_type(doc["valueSchema"]),
        "key_schema_id": int(doc.get("keySchemaId", 0)),
        "value_schema_id": int(doc.get("valueSchemaId", 0)),
    }
    family = str(doc["columnFamilyName"])
    if kind in ("value", "list", "map"):
        return open_state_variable(
            directory, kind, column_family=family, key_schema=key_schema, **avro, **common
        )
    encoding = RocksDBEncoding(
        key_schema,
        column_family=None if family == DEFAULT_STORE else family,
        prefix_columns=int(spec.get("numColsPrefixKey", 0)),
        range_scan=encoder.startswith("RangeKeyScan"),
        **avro,
    )
    return RocksDBStateFiles(directory, encoding, **common)


def commit_log_ids(
    checkpoint: Path, operator_id: int, partition: int
) -> Callable[[int], frozenset[str] | None]:
    """``committed_ids`` for :class:`RocksDBStateFiles`: the unique ids ``commits/<version -
    1>`` records for the operator's partition (``stateUniqueIds``: operator id -> per
    partition the ids of its stores' files), None while the batch is not committed or when
    it records none (checkpointFormatVersion 1). A commit never changes once written, so
    each is read once."""
    known: dict[int, frozenset[str]] = {}

    def ids(version: int) -> frozenset[str] | None:
        if version in known:
            return known[version]
        if not (checkpoint / "commits" / str(version - 1)).is_file():
            return None  # not committed yet (or already dropped from the commit log)
        try:
            commit = read_commit(checkpoint, version - 1)
        except ChangelogError:
            # removed by Spark's log cleanup since the check; an unreadable one raises
            if (checkpoint / "commits" / str(version - 1)).is_file():
                raise
            return None
        for op, parts in commit.state_unique_ids:
            if op == operator_id and partition < len(parts):
                known[version] = frozenset(parts[partition])
                return known[version]
        return None

    return ids
