"""Reading a topic's records as rows, without a broker: DDL columns, JSON values by type, key
formats. (Placement by murmur2 is checked against a real broker in
tests/kafka/test_follow_topic.py.)"""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pytest

from sparkiq.errors import ConfigError
from sparkiq.schema.types import DataType
from sparkiq.topics.columns import parse_columns, parse_ddl_type
from sparkiq.topics.jsonvalues import BadValue, reader
from sparkiq.topics.keys import KeyFormat
from sparkiq.topics.records import TopicFormat, table_schema


def test_ddl_columns_nest_and_name_spark_types() -> None:
    fields = parse_columns(
        "id BIGINT NOT NULL, `odd name` varchar(10), price DECIMAL(10, 2), "
        "tags ARRAY<STRING>, attrs MAP<STRING, INT>, at STRUCT<start: TIMESTAMP, n TINYINT>"
    )
    assert [(f.name, f.type.simple_string(), f.nullable) for f in fields] == [
        ("id", "bigint", False),
        ("odd name", "string", True),
        ("price", "decimal(10,2)", True),
        ("tags", "array<string>", True),
        ("attrs", "map<string,int>", True),
        ("at", "struct<start:timestamp,n:tinyint>", True),
    ]
    assert parse_ddl_type("array<decimal(38,0)>").element == DataType("decimal", 38, 0)
    with pytest.raises(ConfigError, match="expected >, found the end"):
        parse_columns("a ARRAY<STRING")


def test_json_values_are_read_by_type_and_refused_when_they_do_not_fit() -> None:
    price = reader(DataType("decimal", 10, 2), "price")
    assert price("12.3") == Decimal("12.30") and price(7) == Decimal("7.00")
    for bad in ("12.345", "1e20", True, [1]):
        with pytest.raises(BadValue):
            price(bad)
    stamp = reader(DataType("timestamp"), "at")
    assert stamp("2026-11-29T01:31:05.123456+01:00") == dt.datetime(
        2026, 11, 29, 0, 31, 5, 123456, tzinfo=dt.UTC
    )
    count = reader(DataType("integer"), "n")
    assert count(3) == 3
    for bad in (1.5, True, "3", 2**31):
        with pytest.raises(BadValue):
            count(bad)
    ratio = reader(DataType("double"), "r")
    assert ratio(2) == 2.0 and str(ratio("-Infinity")) == "-inf"


def test_a_json_key_is_written_back_to_the_same_bytes() -> None:
    schema = table_schema("day DATE, carrier STRING, n INT", ["carrier", "day"])
    keys = KeyFormat(schema, "json")
    data = '{"carrier":"Ü","day":"2026-11-29"}'.encode()
    internal = keys.read(data)
    assert keys.write(internal) == data
    with pytest.raises(BadValue, match="'day' is null or missing"):
        keys.read(b'{"carrier":"AA"}')


def test_the_kafka_key_format() -> None:
    keys = KeyFormat(table_schema("id BIGINT, v STRING", "id"), "kafka")
    assert keys.read(struct.pack(">q", -5)) == (-5,)
    assert keys.write((-5,)) == struct.pack(">q", -5)
    with pytest.raises(BadValue, match="8 bytes, got 4"):
        keys.read(b"\x00\x00\x00\x01")
    with pytest.raises(ConfigError, match="STRING, INT, BIGINT or DOUBLE"):
        KeyFormat(table_schema("d DATE, v STRING", "d"), "kafka")


def test_string_values_fill_the_one_other_column() -> None:
    fmt = TopicFormat(table_schema("k STRING, body STRING", "k"), "kafka", "string")
    assert fmt.read_value({"k": "a"}, "héllo".encode()) == {"k": "a", "body": "héllo"}
    with pytest.raises(ConfigError, match="one STRING column besides the key"):
        TopicFormat(table_schema("k STRING, a STRING, b STRING", "k"), "json", "string")
