"""transformWithState(InPandas) state variables as tables a replica can hold.

Spark keeps every state variable of a ``transformWithState`` operator in one RocksDB
database, each in its own virtual column family named after the variable (``$``-prefixed
column families -- ``$rowCounter_*``, ``$ttl_*``, ``$procTimers_*``, ``$eventTimers_*`` -- are
Spark's bookkeeping and are not served). Each variable becomes one table, keyed so that every
row has exactly one key, with the UnsafeRow bytes the row decoder reads:

========== ====================================================== ==========================
variable   key columns                                            value columns
========== ====================================================== ==========================
ValueState the grouping key's columns                             the value's columns
ListState  the grouping key's columns, then ``list_index`` (int,  the element's columns
           0-based, in append order)
MapState   the grouping key's columns, then the user key's        the map value's columns
           columns (a user key column named like a grouping key
           column is renamed ``user_<name>``)
========== ====================================================== ==========================

So ``SELECT * FROM items WHERE k = 'a'`` returns one row per list element, as Spark's own
State Data Source does (``list_element``), plus the element's position; ``SELECT`` over a
map state returns one row per (grouping key, user key). Values keep Spark's value schema, so
a variable with TTL keeps whatever expiration column Spark stores beside the value.

A list's appends (changelog merge records) need the list's length before them; a
:class:`ListStateFiles` tracks the length per grouping key (one int per key) as its versions
are read in order, and rebuilds it from the newest snapshot when asked out of order.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from sparkiq.checkpoint.provider import FileStamp
from sparkiq.checkpoint.unsaferow import UnsafeRowError, field_is_variable, join_rows, nested_row
from sparkiq.errors import ChangelogError
from sparkiq.schema.types import DataType, Field, parse_type

__all__ = [
    "LIST_INDEX",
    "MERGE",
    "ListStateFiles",
    "MapStateFiles",
    "RawRecord",
    "RawStateFiles",
    "ColumnFamily",
    "StateVariable",
    "StateVariableKind",
    "read_schema_v3",
    "served_schemas",
    "state_variables",
    "variable_kind",
]

StateVariableKind = Literal["value", "list", "map"]
#: The key column a list element's position is served under.
LIST_INDEX = "list_index"
_KINDS: dict[str, StateVariableKind] = {
    "valuestate": "value",
    "liststate": "list",
    "mapstate": "map",
}
_INT = DataType("integer")
_SLOT = struct.Struct("<q")
#: The changelog's record kinds (Spark's ``RecordType`` bytes).
PUT, DELETE, MERGE = 0x01, 0x10, 0x11


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One changelog record of one store: ``kind`` PUT / DELETE / MERGE, key and value as
    RocksDB holds them (column family prefix removed, encoder framing kept)."""

    kind: int
    key: bytes
    value: bytes | None


class RawStateFiles(Protocol):
    """What the RocksDB reader offers the state variable views: raw records and snapshot
    pairs, the encoder framing's removal, and the error for rows of the file it read last
    that do not parse (``corrupt``, naming that file)."""

    def versions(self) -> list[int]: ...

    def snapshot_versions(self) -> list[int]: ...

    def changes(self, version: int) -> Iterator[tuple[bytes, bytes | None]]: ...

    def snapshot(self, version: int) -> Iterator[tuple[bytes, bytes]]: ...

    def stamp(self, version: int) -> FileStamp | None: ...

    def records(self, version: int) -> list[RawRecord]: ...

    def raw_snapshot(self, version: int) -> list[tuple[bytes, bytes]]: ...

    def unframe_key(self, key: bytes) -> bytes: ...

    def unframe_values(self, value: bytes) -> list[bytes]: ...

    def corrupt(self, message: str) -> ChangelogError: ...


@dataclass(frozen=True, slots=True)
class StateVariable:
    """A state variable as operator metadata v2 describes it."""

    name: str
    kind: StateVariableKind
    ttl: bool


def state_variables(
    operator_metadata: Mapping[str, Any], operator_id: int
) -> dict[str, StateVariable]:
    """The state variables of a transformWithState operator, by name, from its operator
    metadata v2 document (``operatorPropertiesJson``'s ``stateVariables``): the value, list
    and map states (timers are Spark's own); empty for other operators."""
    try:
        props = json.loads(operator_metadata.get("operatorPropertiesJson") or "{}")
        found = {}
        for item in props.get("stateVariables") or ():
            name = str(item["stateName"])
            kind = _KINDS.get(str(item["stateVariableType"]).lower())
            if kind is not None:  # TimerState: Spark's own timers ($procTimers_...)
                found[name] = StateVariable(name, kind, bool(item.get("ttlEnabled")))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ChangelogError(
            f"operator {operator_id}: unreadable operatorPropertiesJson in its metadata: {exc}"
        ) from None
    return found


def variable_kind(state_variable_type: str) -> StateVariableKind:
    """The kind of a variable from operator metadata v2's ``stateVariableType``
    (``ValueState``, ``ListState``, ``MapState``); anything else is refused by name."""
    kind = _KINDS.get(state_variable_type.lower())
    if kind is None:
        raise ChangelogError(
            f"state variable type {state_variable_type!r} is not served: supported are "
            "ValueState, ListState and MapState"
        )
    return kind


def served_schemas(
    kind: StateVariableKind, key_schema: DataType, value_schema: DataType
) -> tuple[DataType, DataType]:
    """The (key, value) struct schemas of the table a variable is served as, from the key
    and value schemas Spark records for its column family (``_stateSchema`` v3)."""
    if kind == "value":
        return key_schema, value_schema
    if kind == "list":
        fields = (*key_schema.fields, Field(LIST_INDEX, _INT, nullable=False))
        return DataType("struct", fields=fields), value_schema
    grouping, user = _map_parts(key_schema)
    taken = {f.name for f in grouping.fields}
    renamed = tuple(
        Field(f"user_{f.name}" if f.name in taken else f.name, f.type, f.nullable)
        for f in user.fields
    )
    return DataType("struct", fields=(*grouping.fields, *renamed)), value_schema


@dataclass(frozen=True, slots=True)
class ColumnFamily:
    """One column family of a ``_stateSchema`` v3 file: Spark's key and value schemas and
    its key encoder (``keyStateEncoderSpec``: ``keyStateEncoderType`` NoPrefix / PrefixKeyScan
    (``numColsPrefixKey``) / RangeKeyScan (``orderingOrdinals``)). ``key_schema_id`` and
    ``value_schema_id`` are the ids Spark's Avro encoding writes before each key and value
    (they change when a query evolves its state schema)."""

    name: str
    key_schema: DataType
    value_schema: DataType
    key_encoder: dict[str, Any]
    key_schema_id: int = 0
    value_schema_id: int = 0

    def spec_json(self, variable: StateVariable | None = None) -> str:
        """A self-contained JSON description (what ``StateStoreInfo.schema_json`` holds for a
        transformWithState variable; ``sparkiq.checkpoint.rocksdb_stores`` opens the store
        from it)."""
        doc: dict[str, Any] = {
            "columnFamilyName": self.name,
            "keySchema": self.key_schema.to_json(),
            "valueSchema": self.value_schema.to_json(),
            "keyStateEncoderSpec": self.key_encoder,
            "keySchemaId": self.key_schema_id,
            "valueSchemaId": self.value_schema_id,
        }
        if variable is not None:
            doc["stateVariableKind"] = variable.kind
            doc["ttlEnabled"] = variable.ttl
        return json.dumps(doc, sort_keys=True)


def read_schema_v3(path: str | Path) -> list[ColumnFamily]:
    """The column families of a state schema v3 file (``state/<op>/_stateSchema/<store>/
    <batch>_<uuid>``), as Spark's ``StateSchemaV3File`` writes it with Java's DataOutput:
    ``writeUTF("v3")``, ``int`` family count, then per family ``writeUTF`` name, ``short``
    key schema id, key schema JSON, ``short`` value schema id, value schema JSON, key encoder
    spec JSON and user key schema JSON -- each JSON as ``int`` chunk count + ``writeUTF``
    chunks (writeUTF holds at most 64 KiB)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ChangelogError(f"state schema file {path} does not exist") from None
    pos = 0

    def utf() -> str:
        nonlocal pos
        (size,) = struct.unpack_from(">H", data, pos)
        if pos + 2 + size > len(data):
            raise ValueError("string overruns the file")
        pos += 2 + size
        return data[pos - size : pos].decode("utf-8")

    def number(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return int(value)

    def chunked() -> str:
        return "".join(utf() for _ in range(number(">i")))

    try:
        if utf() != "v3":
            raise ValueError("it does not start with v3")
        families = []
        for _ in range(number(">i")):
            name = utf()
            key_id = number(">h")
            key = chunked()
            value_id = number(">h")
            value = chunked()
            spec = chunked()
            chunked()  # the user key schema (map state): also the key schema's second field
            families.append(
                ColumnFamily(
                    name,
                    parse_type(json.loads(key)),
                    parse_type(json.loads(value)),
                    json.loads(spec),
                    key_id,
                    value_id,
                )
            )
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} bytes after the last column family")
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ChangelogError(
            f"state schema file {path} is not a readable v3 schema file: {exc}"
        ) from None
    return families


def _map_parts(key_schema: DataType) -> tuple[DataType, DataType]:
    fields = key_schema.fields
    if len(fields) != 2 or any(f.type.name != "struct" for f in fields):
        raise ChangelogError(
            f"map state key schema {key_schema.simple_string()} is not "
            "struct<key: struct, userKey: struct>"
        )
    return fields[0].type, fields[1].type


class MapStateFiles:
    """Map state: Spark's composite key ``(key: struct, userKey: struct)`` flattened into one
    row of the grouping key's columns followed by the user key's."""

    def __init__(self, files: RawStateFiles, key_schema: DataType) -> None:
        grouping, user = _map_parts(key_schema)
        self._files = files
        self._grouping = (
            len(grouping.fields),
            tuple(field_is_variable(f.type) for f in grouping.fields),
        )
        self._user = (len(user.fields), tuple(field_is_variable(f.type) for f in user.fields))

    def versions(self) -> list[int]:
        return self._files.versions()

    def snapshot_versions(self) -> list[int]:
        return self._files.snapshot_versions()

    def changes(self, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        for key, value in self._files.changes(version):
            yield self._flatten(key), value

    def snapshot(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._files.snapshot(version):
            yield self._flatten(key), value

    def stamp(self, version: int) -> FileStamp | None:
        return self._files.stamp(version)

    def _flatten(self, key: bytes) -> bytes:
        try:
            grouping = nested_row(key, 0, 2)
            user = nested_row(key, 1, 2)
            return join_rows(grouping, self._grouping[1], user, self._user[1])
        except UnsafeRowError as exc:
            raise self._files.corrupt(f"map state key without its parts: {exc}") from None


class ListStateFiles:
    """List state served one row per element, keyed by (grouping key, ``list_index``).

    A put replaces a key's list (rows past the new length are removed), a delete removes
    them all, a merge appends after the current length. Not thread-safe: one reader per
    instance, versions read in order are cheapest.
    """

    def __init__(self, files: RawStateFiles, key_schema: DataType) -> None:
        self._files = files
        self._key_var = tuple(field_is_variable(f.type) for f in key_schema.fields)
        self._lengths: dict[bytes, int] = {}
        self._at: int | None = None  # the version self._lengths describe, None = unknown

    def versions(self) -> list[int]:
        return self._files.versions()

    def snapshot_versions(self) -> list[int]:
        return self._files.snapshot_versions()

    def stamp(self, version: int) -> FileStamp | None:
        return None  # a version's rows depend on the lengths this reader tracks: never ahead

    def snapshot(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        self._at = None
        lengths: dict[bytes, int] = {}
        for raw_key, raw_value in self._files.raw_snapshot(version):
            key = self._files.unframe_key(raw_key)
            elements = self._files.unframe_values(raw_value)
            lengths[key] = len(elements)
            for index, element in enumerate(elements):
                yield self._row_key(key, index), element
        self._lengths, self._at = lengths, version

    def changes(self, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        if self._at != version - 1:
            self._catch_up(version - 1)
        self._at = None
        lengths = self._lengths
        for rec in self._files.records(version):
            key = self._files.unframe_key(rec.key)
            before = lengths.get(key, 0)
            if rec.kind == MERGE:
                assert rec.value is not None
                elements = self._files.unframe_values(rec.value)
                for offset, element in enumerate(elements):
                    yield self._row_key(key, before + offset), element
                lengths[key] = before + len(elements)
                continue
            elements = [] if rec.value is None else self._files.unframe_values(rec.value)
            for index, element in enumerate(elements):
                yield self._row_key(key, index), element
            for index in range(len(elements), before):
                yield self._row_key(key, index), None
            if elements:
                lengths[key] = len(elements)
            else:
                lengths.pop(key, None)
        self._at = version

    def _catch_up(self, version: int) -> None:
        """Rebuild the per-key lengths at ``version`` from the newest snapshot at or before
        it plus the changes after it."""
        self._lengths, self._at = {}, 0
        base = max((v for v in self._files.snapshot_versions() if v <= version), default=0)
        if base:
            for _ in self.snapshot(base):
                pass
        for v in range(base + 1, version + 1):
            for _ in self.changes(v):
                pass

    def _row_key(self, key: bytes, index: int) -> bytes:
        try:
            return join_rows(key, self._key_var, bytes(8) + _SLOT.pack(index), (False,))
        except UnsafeRowError as exc:
            raise self._files.corrupt(f"list state key: {exc}") from None
