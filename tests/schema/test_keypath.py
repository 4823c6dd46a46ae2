"""The compiled key path of a table against the codec and partitioner it is built from.

:func:`~sparkiq.schema.keypath.key_locator` must give, for every key, exactly the internal
values, partition and encoding that :class:`~sparkiq.schema.keycodec.KeyCodec` and
:func:`~sparkiq.schema.partitioner.spark_hash` give (the partitioner itself is checked
against Spark in ``test_partitioner.py``), and refuse bad keys with the codec's own errors.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import msgspec
import pytest

from sparkiq.errors import InvalidQueryError
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.keypath import key_locator
from sparkiq.schema.partitioner import Partitioner, spark_hash
from sparkiq.schema.types import Field, TableSchema, parse_type


def _schema(key: list[str], columns: dict[str, str]) -> TableSchema:
    fields = tuple(Field(n, parse_type(t)) for n, t in columns.items())
    return TableSchema(fields, tuple(key))


def _expected(codec: KeyCodec, types: list[str], partitions: int, key: Any) -> tuple[Any, ...]:
    internal = codec.to_internal(key)
    return internal, spark_hash(internal, types) % partitions, codec.encode(internal)


def _keys(rng: random.Random) -> list[str]:
    ascii_keys = ["".join(chr(rng.randrange(0, 0x80)) for _ in range(n % 23)) for n in range(300)]
    other = ["\u00e9", "\u20ac" * 3, "\U0001f600", "a\x00b\x00", "key-00000001", ""]
    return ascii_keys + other


@pytest.mark.parametrize("partitions", [1, 8, 200])
def test_string_keys_match_codec_and_hash(partitions: int) -> None:
    schema = _schema(["k"], {"k": "string", "n": "long"})
    codec, partitioner = KeyCodec(schema), Partitioner(["string"], partitions)
    locate = key_locator(codec, partitioner)
    for key in [*_keys(random.Random(5)), None]:
        assert locate(key) == _expected(codec, ["string"], partitions, key), repr(key)


def test_composite_keys_match_codec_and_hash() -> None:
    schema = _schema(["carrier", "flight"], {"carrier": "string", "flight": "integer", "n": "long"})
    codec, partitioner = KeyCodec(schema), Partitioner(["string", "integer"], 8)
    locate = key_locator(codec, partitioner)
    rng = random.Random(9)
    for carrier in _keys(rng)[:60]:
        key = (carrier, rng.randrange(-(2**31), 2**31))
        assert locate(key) == _expected(codec, ["string", "integer"], 8, key)
    assert locate(["AA", 100]) == _expected(codec, ["string", "integer"], 8, ("AA", 100))


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (7, "key column 'k' is string; got int 7: pass a str"),
        (b"AA", "key column 'k' is string; got bytes b'AA': pass a str"),
        ("a\ud800", "without lone surrogates"),
    ],
)
def test_bad_keys_get_the_codec_errors(key: Any, message: str) -> None:
    schema = _schema(["k"], {"k": "string"})
    codec = KeyCodec(schema)
    locate = key_locator(codec, Partitioner(["string"], 8))
    with pytest.raises(InvalidQueryError) as fast:
        locate(key)
    with pytest.raises(InvalidQueryError) as plain:
        codec.to_internal(key)
    assert str(fast.value) == str(plain.value)
    assert message in str(fast.value)


def test_a_str_subclass_takes_the_codec_path() -> None:
    schema = _schema(["k"], {"k": "string"})
    codec = KeyCodec(schema)
    located = key_locator(codec, Partitioner(["string"], 8))(_Text("AA"))
    assert located == _expected(codec, ["string"], 8, "AA")
    assert type(located[0][0]) is str  # the codec's internal value, not the subclass


def test_the_row_decoder_builds_each_row_as_before() -> None:
    """Column names that would break generated source are plain literals to it; a row
    wider than the schema is cut to its columns, as ``dict(zip(...))`` did."""
    names = {"k": "string", "it's": "long", 'a"b\\': "double", "0": "string", "d": "date"}
    codec = RowCodec(_schema(["k"], names))
    raw = msgspec.msgpack.encode(["x", 1, 2.5, None, 19_000])
    row = codec.decode(raw)
    assert list(row) == list(names) and row["it's"] == 1 and row['a"b\\'] == 2.5
    assert row["d"].isoformat() == "2022-01-08" and row["0"] is None
    assert codec.decode_row(raw) == row
    assert codec.decode(msgspec.msgpack.encode(["x", 1, 2.5, "y", 0, 9])) == row | {
        "d": dt.date(1970, 1, 1),
        "0": "y",
    }


@pytest.mark.parametrize("key", [("AA",), ("AA", 1, 2), "AA", ("AA", "1"), (7, 1), ("AA", 2**40)])
def test_bad_composite_keys_get_the_codec_errors(key: Any) -> None:
    schema = _schema(["carrier", "flight"], {"carrier": "string", "flight": "integer"})
    codec = KeyCodec(schema)
    locate = key_locator(codec, Partitioner(["string", "integer"], 8))
    with pytest.raises(InvalidQueryError) as fast:
        locate(key)
    with pytest.raises(InvalidQueryError) as plain:
        codec.to_internal(key)
    assert str(fast.value) == str(plain.value)
