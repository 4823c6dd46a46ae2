"""A Spark Structured Streaming checkpoint, read in place: batches, operators and their stores.

``Checkpoint(uri)`` reads a checkpoint directory on the local file system (a path or a
``file:`` URI) and never writes to it. What it finds::

    <checkpoint>/metadata                    the query id
    <checkpoint>/offsets/<b>, commits/<b>    batches (see sparkiq.checkpoint.logs)
    <checkpoint>/state/<op>/_metadata/metadata        operator metadata v1
    <checkpoint>/state/<op>/_metadata/v2/<b>          operator metadata v2 (names the schema file)
    <checkpoint>/state/<op>/_stateSchema/<store>/<b>_<uuid>   state schema v3 (column families)
    <checkpoint>/state/<op>/<p>[/<store>]/_metadata/schema    state schema v1/v2 (partition 0)
    <checkpoint>/state/<op>/<p>[/<store>]/...                 the provider's state files

The provider (``hdfs`` or ``rocksdb``), the compression codec and the shuffle partitions are
the query's settings recorded in the newest committed batch's offset log. State version N is
the state after batch N - 1 (see :mod:`sparkiq.checkpoint.provider`).
"""

from __future__ import annotations

import importlib
import json
import struct
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlparse

import sparkiq.checkpoint.tws as tws
from sparkiq.checkpoint.compression import CompressionError, codec_for
from sparkiq.checkpoint.logs import (
    CommitInfo,
    OffsetInfo,
    batch_ids,
    read_commit,
    read_offsets,
)
from sparkiq.checkpoint.provider import DEFAULT_STORE, StateFiles, StateStoreInfo
from sparkiq.errors import ChangelogError, ConfigError, SchemaError
from sparkiq.schema.types import DataType, parse_type

__all__ = ["PROVIDERS", "Checkpoint", "StateStoreInfo"]

_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
_CODEC_CONF = "spark.sql.streaming.stateStore.compression.codec"
_FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
_PARTITIONS_CONF = "spark.sql.shuffle.partitions"
_PACKAGE = "org.apache.spark.sql.execution.streaming.state."
#: Spark's state store provider classes sparkiq reads, by the short name it uses for them.
PROVIDERS = {
    f"{_PACKAGE}HDFSBackedStateStoreProvider": "hdfs",
    f"{_PACKAGE}RocksDBStateStoreProvider": "rocksdb",
}
_DEFAULT_PROVIDER = f"{_PACKAGE}HDFSBackedStateStoreProvider"
# Each provider's module with ``open_state_files``; one missing from this build gives a
# clear error rather than an ImportError.
_PROVIDER_MODULES = {
    "hdfs": "sparkiq.checkpoint.hdfs",
    "rocksdb": "sparkiq.checkpoint.rocksdb_stores",
}
_STATE_FILE_SUFFIXES = (".delta", ".snapshot", ".changelog", ".zip")


class _Opener(Protocol):
    def __call__(self, store: StateStoreInfo, partition: int) -> StateFiles: ...


def _local_path(uri: str | Path) -> Path:
    if isinstance(uri, Path):
        return uri
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"checkpoint {uri!r}: a file: URI must name a local path")
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # "C:" is a drive, not a scheme
        raise ConfigError(
            f"checkpoint {uri!r}: sparkiq reads checkpoints on the local file system (a path or "
            f"a file: URI), not {parsed.scheme}: -- mount it or copy it locally"
        )
    return Path(uri)


class Checkpoint:
    """One streaming query's checkpoint directory, read-only.

    Every method reads the directory afresh (Spark keeps writing it): nothing is cached but
    the path. Raises :class:`~sparkiq.errors.ConfigError` at construction when ``uri`` is
    not a local checkpoint, and :class:`~sparkiq.errors.ChangelogError` for files that are
    missing or in a format sparkiq does not read.
    """

    def __init__(self, uri: str | Path) -> None:
        self.path = _local_path(uri).expanduser().resolve()
        if not self.path.is_dir():
            raise ConfigError(f"checkpoint {str(uri)!r}: no such directory")
        if not (self.path / "offsets").is_dir() and not (self.path / "metadata").is_file():
            raise ConfigError(
                f"checkpoint {str(uri)!r} is not a streaming query's checkpoint (it has no "
                "offsets/ or metadata): pass the query's checkpointLocation"
            )

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r})"

    # --- the query and its batches -------------------------------------------------------

    @property
    def query_id(self) -> str:
        """The query's id (``metadata``); stable across restarts of the query."""
        try:
            return str(json.loads((self.path / "metadata").read_text())["id"])
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise ChangelogError(f"checkpoint {self.path}: no readable metadata file") from exc

    def committed_batches(self) -> list[int]:
        """Batch ids that have both an offset log and a commit log file, ascending. A batch
        whose commit is missing (running, or failed) is not listed: its state is not final."""
        offsets = set(batch_ids(self.path / "offsets"))
        return [b for b in batch_ids(self.path / "commits") if b in offsets]

    def latest_batch(self) -> int | None:
        """The newest committed batch id, or None before the first commit."""
        batches = self.committed_batches()
        return batches[-1] if batches else None

    def offsets(self, batch: int) -> OffsetInfo:
        return read_offsets(self.path, batch)

    def commit(self, batch: int) -> CommitInfo:
        return read_commit(self.path, batch)

    def commit_time(self, batch: int) -> float:
        """When ``commits/<batch>`` was written (seconds since the epoch)."""
        return self.commit(batch).time

    def _settings(self) -> OffsetInfo:
        latest = self.latest_batch()
        if latest is None:
            started = batch_ids(self.path / "offsets")
            if not started:
                raise ChangelogError(f"checkpoint {self.path} has no batch yet")
            latest = started[-1]
        return self.offsets(latest)

    @property
    def shuffle_partitions(self) -> int:
        """The query's ``spark.sql.shuffle.partitions`` (fixed for the checkpoint's life)."""
        return int(self._settings().setting(_PARTITIONS_CONF, "200"))

    @property
    def provider(self) -> str:
        """``"hdfs"`` or ``"rocksdb"``: the query's state store provider."""
        name = self._settings().setting(_PROVIDER_CONF, _DEFAULT_PROVIDER)
        if name not in PROVIDERS:
            raise ChangelogError(
                f"checkpoint {self.path}: state store provider {name} is not one sparkiq reads; "
                f"supported: {', '.join(sorted(PROVIDERS))}"
            )
        return PROVIDERS[name]

    # --- operators and stores ------------------------------------------------------------

    def operator_ids(self) -> list[int]:
        return batch_ids(self.path / "state")

    def stores(self) -> list[StateStoreInfo]:
        """Every state store of every stateful operator, by operator id then store name.

        A transformWithState operator's column families are one store each (named by the
        state variable); Spark's internal families (names starting with ``$``) are left out.
        Empty before the query's first batch has started.
        """
        if not batch_ids(self.path / "offsets"):
            return []
        settings = self._settings()
        provider = self.provider
        try:
            codec = codec_for(settings.setting(_CODEC_CONF, "lz4"))
        except CompressionError as exc:
            raise ChangelogError(f"checkpoint {self.path}: {exc}") from None
        common: dict[str, Any] = {
            "checkpoint": self.path,
            "provider": provider,
            "codec": codec,
            "checkpoint_format_version": int(settings.setting(_FORMAT_CONF, "1")),
            "conf": settings.conf,
        }
        found: list[StateStoreInfo] = []
        for op in self.operator_ids():
            found.extend(self._operator_stores(op, settings, common))
        return found

    def store(self, name: str, operator_id: int | None = None) -> StateStoreInfo:
        """The store named ``name`` (of ``operator_id`` when several operators have one)."""
        matches = [
            s
            for s in self.stores()
            if s.store_name == name and operator_id in (None, s.operator_id)
        ]
        if len(matches) != 1:
            have = [(s.operator_id, s.store_name) for s in self.stores()]
            raise ChangelogError(
                f"checkpoint {self.path}: {len(matches)} stores named {name!r}"
                f"{'' if operator_id is None else f' in operator {operator_id}'}; stores: {have}"
            )
        return matches[0]

    def files(self, store: StateStoreInfo, partition: int) -> StateFiles:
        """The files of ``store``'s ``partition``, read by its provider's reader."""
        if not 0 <= partition < store.partitions:
            raise ConfigError(
                f"{store.describe()}: partition {partition} is not in 0..{store.partitions - 1}"
            )
        module_name = _PROVIDER_MODULES[store.provider]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            raise ChangelogError(
                f"{store.describe(partition)}: this sparkiq cannot read the {store.provider} "
                "state store provider's files yet"
            ) from None
        return cast(_Opener, module.open_state_files)(store, partition)

    def _operator_stores(
        self, op: int, settings: OffsetInfo, common: dict[str, Any]
    ) -> list[StateStoreInfo]:
        op_dir = self.path / "state" / str(op)
        meta = _operator_metadata(op_dir, settings.batch)
        info = meta.get("operatorInfo", {}) if meta else {}
        name = str(info.get("operatorName", ""))
        entries = list(meta.get("stateStoreInfo", [])) if meta else []
        default_partitions = int(settings.setting(_PARTITIONS_CONF, "200"))
        if not entries:  # no operator metadata (Spark < 3.5 wrote none): list the files
            entries = [
                {"storeName": s, "numPartitions": default_partitions}
                for s in _stores_on_disk(op_dir / "0")
            ]
        found: list[StateStoreInfo] = []
        for entry in entries:
            state_store = str(entry.get("storeName", DEFAULT_STORE))
            base = {
                **common,
                "operator_id": op,
                "operator_name": name,
                "partitions": int(entry.get("numPartitions", default_partitions)),
                "state_store": state_store,
                "num_cols_prefix_key": int(entry.get("numColsPrefixKey", 0)),
            }
            # Spark 4.0 writes "stateSchemaFilePath", later versions "stateSchemaFilePaths"
            schema_files = entry.get("stateSchemaFilePaths") or [
                f for f in [entry.get("stateSchemaFilePath")] if f
            ]
            if schema_files:
                variables = tws.state_variables(meta or {}, op)
                for family in tws.read_schema_v3(_local_path(str(schema_files[-1]))):
                    if family.name.startswith("$"):
                        continue  # Spark's own bookkeeping (TTL indexes, timers...)
                    variable = variables.get(family.name)
                    key, value = family.key_schema, family.value_schema
                    if variable is not None:
                        key, value = tws.served_schemas(variable.kind, key, value)
                    found.append(
                        StateStoreInfo(
                            **base,
                            store_name=family.name if family.name != DEFAULT_STORE else state_store,
                            column_family=family.name,
                            key_schema=key,
                            value_schema=value,
                            schema_json=family.spec_json(variable),
                        )
                    )
                continue
            directory = op_dir / "0"
            if state_store != DEFAULT_STORE:
                directory = directory / state_store
            key, value = _schema_v1v2(directory / "_metadata" / "schema", op, state_store)
            found.append(
                StateStoreInfo(**base, store_name=state_store, key_schema=key, value_schema=value)
            )
        return found


def _operator_metadata(op_dir: Path, batch: int | None) -> dict[str, Any] | None:
    """The operator metadata in force at ``batch``: the newest v2 file of a batch at or
    before it (``_metadata/v2/<b>``; Spark 4.0 wrote ``_metadata/metadata/v2/<b>``), else the
    v1 file ``_metadata/metadata``; None when there is none (Spark < 3.5)."""
    candidates: list[Path] = []
    for v2 in (op_dir / "_metadata" / "v2", op_dir / "_metadata" / "metadata" / "v2"):
        written = [b for b in batch_ids(v2) if batch is None or b <= batch]
        candidates.extend(v2 / str(b) for b in reversed(written))
    candidates.append(op_dir / "_metadata" / "metadata")
    for path in candidates:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:  # removed by Spark's purge since the listing
            continue
        version, _, body = text.partition("\n")
        if version.strip() not in ("v1", "v2"):
            raise ChangelogError(
                f"operator metadata {path} has version {version.strip()!r}; sparkiq reads v1, v2"
            )
        try:
            doc = json.loads(body)
        except ValueError:
            raise ChangelogError(f"operator metadata {path} is not valid JSON") from None
        return doc if isinstance(doc, dict) else None
    return None


def _stores_on_disk(partition_dir: Path) -> list[str]:
    try:
        entries = list(partition_dir.iterdir())
    except FileNotFoundError:
        return []
    names = [p.name for p in entries if p.is_dir() and not p.name.startswith(("_", "."))]
    if any(p.name.endswith(_STATE_FILE_SUFFIXES) for p in entries if p.is_file()):
        names.append(DEFAULT_STORE)
    return sorted(names)


def _struct(doc: Any, path: Path) -> DataType:
    if isinstance(doc, str):
        doc = json.loads(doc)
    try:
        dtype = parse_type(doc)
    except (SchemaError, KeyError, TypeError):
        raise ChangelogError(
            f"state schema file {path} holds a schema sparkiq cannot read"
        ) from None
    if dtype.name != "struct":
        raise ChangelogError(f"state schema file {path} holds a {dtype.name}, not a struct")
    return dtype


# Java's DataOutputStream.writeUTF: a big-endian uint16 byte length, then (modified) UTF-8.
_UTF_LENGTH = struct.Struct(">H")
_INT = struct.Struct(">i")


def _java_utf(data: bytes, pos: int) -> tuple[str, int]:
    (size,) = _UTF_LENGTH.unpack_from(data, pos)
    end = pos + 2 + size
    if end > len(data):
        raise ValueError("a string runs past the end of the file")
    return data[pos + 2 : end].decode("utf-8", errors="strict"), end


def _schema_v1v2(path: Path, op: int, store: str) -> tuple[DataType, DataType]:
    """Key and value schema from a v1 or v2 state schema file (``StateSchemaCompatibilityChecker``):
    ``writeUTF("v1")`` + two ``writeUTF`` JSON schemas, or ``writeUTF("v2")`` + for key and
    value an int32 chunk count and that many ``writeUTF`` chunks."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ChangelogError(
            f"operator {op}, store {store!r}: no state schema file {path}; sparkiq needs it to "
            "decode the state (Spark writes it when the query first runs)"
        ) from None
    try:
        version, pos = _java_utf(data, 0)
        parts: list[str] = []
        if version == "v1":
            for _ in range(2):
                text, pos = _java_utf(data, pos)
                parts.append(text)
        elif version == "v2":
            for _ in range(2):
                (chunks,) = _INT.unpack_from(data, pos)
                pos += 4
                text = ""
                for _ in range(chunks):
                    chunk, pos = _java_utf(data, pos)
                    text += chunk
                parts.append(text)
        else:
            raise ChangelogError(
                f"state schema file {path} has version {version!r}; sparkiq reads v1, v2, v3"
            )
        return _struct(parts[0], path), _struct(parts[1], path)
    except (ValueError, struct.error) as exc:
        raise ChangelogError(f"state schema file {path} is unreadable: {exc}") from None
