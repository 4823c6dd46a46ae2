"""MessagePack for the values sparkiq returns, keeping their Python types.

Plain MessagePack loses what a row needs to round-trip exactly, so these types travel as
MessagePack extensions (codes are part of protocol version 1 and never reused):

====  =====================  ==============================================================
code  Python type            payload
====  =====================  ==============================================================
1     datetime.datetime      ISO 8601 text; naive stays naive, an offset is kept
2     datetime.date          ISO 8601 text
3     decimal.Decimal        its exact text
4     tuple                  a MessagePack array of the (encoded) items
5     pyarrow.Table          Arrow IPC stream
6     bytearray              the bytes
7     enum member            ``"<registered name>:<member name>"`` (see :func:`register_enum`)
8     dict with typed keys   a MessagePack array of ``[key, value]`` pairs (a Spark map keyed
                             by dates, timestamps, decimals...: extensions cannot be map keys)
9     record (dataclass)     a MessagePack array ``[registered name, [field values...]]`` in
                             field order (see :func:`register_record`)
====  =====================  ==============================================================

Decoding never runs code from the payload: extensions build only the types above, enums
only from the registry, and records only of registered classes, through their constructor.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import msgspec

__all__ = ["pack", "register_enum", "register_record", "to_wire", "unpack", "unpack_plain"]

_DATETIME, _DATE, _DECIMAL, _TUPLE, _ARROW, _BYTEARRAY, _ENUM, _PAIRS = 1, 2, 3, 4, 5, 6, 7, 8
_RECORD = 9

_ENUMS: dict[str, type[enum.Enum]] = {}
_ENUM_NAMES: dict[type[enum.Enum], str] = {}


def register_enum(cls: type[enum.Enum], name: str | None = None) -> type[enum.Enum]:
    """Allow members of ``cls`` on the wire (decoders build only registered enums)."""
    key = name or f"{cls.__module__}.{cls.__qualname__}"
    _ENUMS[key] = cls
    _ENUM_NAMES[cls] = key
    return cls


# A record class's wire name and field names, and back; written at import, read anywhere.
_RECORDS: dict[str, tuple[type, tuple[str, ...]]] = {}
_RECORD_NAMES: dict[type, str] = {}


def register_record(cls: type, name: str | None = None) -> type:
    """Allow instances of the dataclass ``cls`` on the wire, as its fields in order (each
    encoded like any value); decoding calls ``cls(*fields)``, so its checks run."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"a wire record must be a dataclass, got {cls!r}")
    key = name or f"{cls.__module__}.{cls.__qualname__}"
    _RECORDS[key] = (cls, tuple(f.name for f in dataclasses.fields(cls)))
    _RECORD_NAMES[cls] = key
    return cls


def _convert_record(name: str, value: Any) -> msgspec.msgpack.Ext:
    fields = [to_wire(getattr(value, f)) for f in _RECORDS[name][1]]
    return _ext(_RECORD, _encoder.encode([name, fields]))


_encoder = msgspec.msgpack.Encoder()


def _ext(code: int, data: bytes) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(code, data)


def _arrow_ipc(table: Any) -> msgspec.msgpack.Ext:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return _ext(_ARROW, sink.getvalue().to_pybytes())


def _convert_enum(value: enum.Enum) -> msgspec.msgpack.Ext:
    name = _ENUM_NAMES.get(type(value))
    if name is None:
        raise TypeError(f"enum {type(value).__qualname__} is not registered for the wire")
    return _ext(_ENUM, f"{name}:{value.name}".encode())


_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None), bytes})
_CONVERT: dict[type, Callable[[Any], Any]] = {
    dt.datetime: lambda v: _ext(_DATETIME, v.isoformat().encode()),
    dt.date: lambda v: _ext(_DATE, v.isoformat().encode()),
    Decimal: lambda v: _ext(_DECIMAL, str(v).encode()),
    tuple: lambda v: _ext(_TUPLE, _encoder.encode([to_wire(x) for x in v])),
    bytearray: lambda v: _ext(_BYTEARRAY, bytes(v)),
    dict: lambda v: _dict(v),
    list: lambda v: [to_wire(x) for x in v],
}


def _dict(value: dict[Any, Any]) -> Any:
    if all(type(k) in _PLAIN for k in value):
        return {k: to_wire(x) for k, x in value.items()}
    pairs = [[to_wire(k), to_wire(x)] for k, x in value.items()]
    return _ext(_PAIRS, _encoder.encode(pairs))


def to_wire(value: Any) -> Any:
    """``value`` with every type MessagePack would lose replaced by its extension."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    convert = _CONVERT.get(kind)
    if convert is not None:
        return convert(value)
    record = _RECORD_NAMES.get(kind)
    if record is not None:
        return _convert_record(record, value)
    if isinstance(value, enum.Enum):
        return _convert_enum(value)
    if kind.__module__.startswith("pyarrow") and hasattr(value, "schema"):
        return _arrow_ipc(value)
    for base, convert in _CONVERT.items():
        if isinstance(value, base):
            return convert(value)
    raise TypeError(f"cannot send a {kind.__qualname__} over the wire")


def _from_ext(code: int, data: memoryview) -> Any:
    try:
        return _decode_ext(code, data)
    except ValueError:
        raise
    except Exception as exc:  # a payload that is not what its code says (bad decimal text...)
        raise ValueError(f"malformed MessagePack extension {code} on the wire: {exc!r}") from None


def _decode_ext(code: int, data: memoryview) -> Any:
    if code == _DATETIME:
        return dt.datetime.fromisoformat(bytes(data).decode())
    if code == _DATE:
        return dt.date.fromisoformat(bytes(data).decode())
    if code == _DECIMAL:
        return Decimal(bytes(data).decode())
    if code == _TUPLE:
        return tuple(_decoder.decode(data))
    if code == _ARROW:
        import pyarrow as pa

        with pa.ipc.open_stream(pa.py_buffer(bytes(data))) as reader:
            return reader.read_all()
    if code == _BYTEARRAY:
        return bytearray(data)
    if code == _PAIRS:
        return {k: x for k, x in _decoder.decode(data)}
    if code == _RECORD:
        name, fields = _decoder.decode(data)
        found = _RECORDS.get(name) if isinstance(name, str) else None
        if found is None or not isinstance(fields, list) or len(fields) != len(found[1]):
            raise ValueError(f"unknown record {name!r} on the wire")
        return found[0](*fields)
    if code == _ENUM:
        name, _, member = bytes(data).decode().rpartition(":")
        cls = _ENUMS.get(name)
        if cls is None or member not in cls.__members__:
            raise ValueError(f"unknown enum {name}:{member} on the wire")
        return cls[member]
    raise ValueError(f"unknown MessagePack extension {code} on the wire")


_decoder = msgspec.msgpack.Decoder(ext_hook=_from_ext)


def _no_ext(code: int, data: memoryview) -> Any:
    raise ValueError(f"a MessagePack extension ({code}) where only plain values may be")


def _no_tables(code: int, data: memoryview) -> Any:
    if code == _ARROW:
        raise ValueError("an Arrow table where none may be (requests never carry one)")
    return _from_ext(code, data)


_plain_decoder = msgspec.msgpack.Decoder(ext_hook=_no_ext)
_tableless_decoder = msgspec.msgpack.Decoder(ext_hook=_no_tables)


def pack(value: Any) -> bytes:
    """Encode ``value`` (any mix of plain values, rows, keys, Arrow tables). An integer
    beyond MessagePack's 64 bits (DuckDB's HUGEINT) travels as the ``Decimal`` of the same
    value."""
    try:
        return _encoder.encode(to_wire(value))
    except OverflowError:
        return _encoder.encode(to_wire(_wide_ints(value)))


def _wide_ints(value: Any) -> Any:
    """``value`` with every integer MessagePack cannot hold as a ``Decimal`` (the rare path:
    only taken when such an integer is present)."""
    if type(value) is int:
        return Decimal(value) if not -(1 << 63) <= value < 1 << 64 else value
    if type(value) is dict:
        return {_wide_ints(k): _wide_ints(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_wide_ints(v) for v in value)
    return value


def unpack(data: bytes | memoryview, *, tables: bool = True) -> Any:
    """Decode what :func:`pack` produced, with the original types; ``tables=False``
    refuses Arrow tables (whose decoding may decompress many times the input's size): what
    a caller sends is decoded so.

    Malformed input raises :class:`ValueError` (``msgspec.DecodeError`` is one) saying what
    is wrong, never another exception and never a value of another type."""
    return (_decoder if tables else _tableless_decoder).decode(data)


def unpack_plain(data: bytes | memoryview) -> Any:
    """Decode MessagePack holding plain values only (maps, lists, strings, numbers...):
    any extension -- an Arrow table above all, whose decoding may decompress -- is refused
    with :class:`ValueError`, so input that never carries one costs no more than its size."""
    return _plain_decoder.decode(data)
