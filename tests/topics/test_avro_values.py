"""Avro record values read as rows, without a broker: the schema's fields as columns, every
type the mapping names, Confluent's framing and plain Avro, and the records and schemas that
are refused. Values are written here with fastavro's own writer (the ground truth); the
broker round trip is tests/kafka/test_follow_avro.py."""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from sparkiq.errors import ConfigError
from sparkiq.topics.avrovalues import avro_columns
from sparkiq.topics.jsonvalues import BadValue
from sparkiq.topics.records import TopicFormat, table_schema

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "qty", "type": "int"},
        {"name": "ratio", "type": ["float", "null"]},
        {"name": "score", "type": "double"},
        {"name": "paid", "type": "boolean"},
        {"name": "blob", "type": "bytes"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {
            "name": "fee",
            "type": {
                "type": "fixed",
                "name": "Fee",
                "size": 8,
                "logicalType": "decimal",
                "precision": 12,
                "scale": 3,
            },
        },
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {
            "name": "ship",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Ship",
                    "fields": [
                        {"name": "city", "type": "string"},
                        {"name": "eta", "type": {"type": "int", "logicalType": "date"}},
                    ],
                },
            ],
        },
        {"name": "ships", "type": {"type": "array", "items": "Ship"}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "DONE"]}},
        {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 2}},
    ],
}
COLUMNS = (
    "id BIGINT NOT NULL, note STRING, qty INT NOT NULL, ratio FLOAT, score DOUBLE NOT NULL, "
    "paid BOOLEAN NOT NULL, blob BINARY NOT NULL, day DATE NOT NULL, at TIMESTAMP NOT NULL, "
    "at_us TIMESTAMP, local TIMESTAMP_NTZ NOT NULL, price DECIMAL(9,2) NOT NULL, "
    "fee DECIMAL(12,3) NOT NULL, tags ARRAY<STRING> NOT NULL, attrs MAP<STRING,BIGINT> NOT NULL, "
    "ship STRUCT<city: STRING NOT NULL, eta: DATE NOT NULL>, "
    "ships ARRAY<STRUCT<city: STRING NOT NULL, eta: DATE NOT NULL>> NOT NULL, "
    "state STRING NOT NULL, tod INT NOT NULL, code BINARY NOT NULL"
)
UTC = dt.UTC


def order(n: int, **changes: Any) -> dict[str, Any]:
    doc = {
        "id": n,
        "note": f"n{n}-ü",
        "qty": -n,
        "ratio": 0.5,
        "score": n / 3,
        "paid": n % 2 == 0,
        "blob": bytes([n % 256, 0, 255]),
        "day": dt.date(2026, 11, 29),
        "at": dt.datetime(2026, 11, 29, 1, 2, 3, 456000, tzinfo=UTC),
        "at_us": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        "local": dt.datetime(2026, 11, 29, 1, 2, 3, 7),
        "price": Decimal("-1234567.89"),
        "fee": Decimal("0.001"),
        "tags": ["a", None, "c"],
        "attrs": {"x": 1, "y": -(2**63)},
        "ship": {"city": "Zürich", "eta": dt.date(2026, 12, 1)},
        "ships": [{"city": "Oslo", "eta": dt.date(2027, 1, 2)}],
        "state": "DONE",
        "tod": dt.time(13, 14, 15, 16000),
        "code": b"\x00\x01",
    }
    doc.update(changes)
    return doc


def avro(doc: dict[str, Any], schema: dict[str, Any] = SCHEMA) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), doc)
    return out.getvalue()


def framed(doc: dict[str, Any], schema_id: int = 4711, schema: dict[str, Any] = SCHEMA) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + avro(doc, schema)


def as_row(doc: dict[str, Any]) -> dict[str, Any]:
    """What the table holds for ``doc``, computed from the schema's mapping by hand."""
    row = dict(doc)
    row["attrs"] = list(doc["attrs"].items())
    tod: dt.time = doc["tod"]
    row["tod"] = ((tod.hour * 60 + tod.minute) * 60 + tod.second) * 1000 + tod.microsecond // 1000
    return row


@pytest.fixture(scope="module")
def orders() -> TopicFormat:
    schema = table_schema(avro_columns(json.dumps(SCHEMA), ["id"]), "id")
    return TopicFormat(schema, "json", "avro", json.dumps(SCHEMA))


def test_the_record_fields_are_the_columns() -> None:
    got = avro_columns(SCHEMA)
    assert got == table_schema(COLUMNS, "id").fields


def test_framed_and_plain_values_read_as_written(orders: TopicFormat) -> None:
    for n, doc in enumerate(
        [order(1), order(2, note=None, ratio=None, at_us=None, ship=None, tags=[], attrs={})]
    ):
        for data in (framed(doc, schema_id=n), avro(doc)):
            row = orders.read_value({"id": doc["id"]}, data)
            assert row == as_row(doc)
    # the rows fit the table's Arrow types: the store takes them as they are
    assert len(orders.encode_rows([orders.read_value({"id": 1}, avro(order(1)))])) == 1


def test_key_columns_come_from_the_key(orders: TopicFormat) -> None:
    assert orders.read_value({"id": 99}, avro(order(1)))["id"] == 99


def test_a_plain_record_that_starts_with_a_zero_byte() -> None:
    schema = {
        "type": "record",
        "name": "Z",
        "fields": [
            {"name": "z", "type": "int"},
            {"name": "n", "type": ["null", "long"]},
            {"name": "s", "type": "string"},
        ],
    }
    fmt = TopicFormat(table_schema(avro_columns(schema, ["s"]), "s"), "json", "avro", schema)
    docs = [{"z": 0, "n": None, "s": "a long enough string"}, {"z": 0, "n": 5, "s": "xy"}]
    docs += [{"z": 0, "n": None, "s": "\x00\x00\x00\x00\x00\x00"}]
    for doc in docs:
        data = avro(doc, schema)
        assert data[0] == 0
        assert fmt.read_value({"s": doc["s"]}, data) == doc
        assert fmt.read_value({"s": doc["s"]}, framed(doc, 0, schema)) == doc


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not Avro of value_schema"),
        (b"\x02\x04", "not Avro of value_schema"),  # ends inside the record
        (b"\x00\x00\x00\x00\x07" + b"\x02", "not Avro of value_schema"),
        (b'{"id": 1}', "not Avro of value_schema|left over"),  # JSON is no Avro record
    ],
)
def test_values_that_do_not_decode_are_bad(orders: TopicFormat, data: bytes, problem: str) -> None:
    with pytest.raises(BadValue, match=problem):
        orders.read_value({"id": 1}, data)


def test_bytes_left_over_make_a_value_bad(orders: TopicFormat) -> None:
    # a record written with a newer schema (a field added at the end) is not misread
    newer = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "extra", "type": "long"}]}
    data = avro(order(3, extra=12345), newer)
    with pytest.raises(BadValue, match="left over"):
        orders.read_value({"id": 3}, data)
    with pytest.raises(BadValue):
        orders.read_value({"id": 3}, b"\x00\x00\x00\x00\x01" + data)


def test_a_decimal_wider_than_its_precision_is_bad(orders: TopicFormat) -> None:
    wide = json.loads(json.dumps(SCHEMA))
    wide["fields"][11]["type"]["precision"] = 20
    data = avro(order(4, price=Decimal("12345678901.00")), wide)
    with pytest.raises(BadValue, match="more digits than decimal"):
        orders.read_value({"id": 4}, data)


def test_columns_may_name_some_fields_with_wider_types() -> None:
    columns = (
        "id BIGINT, qty BIGINT, ratio DOUBLE, price DECIMAL(20,2), ship STRUCT<city: STRING>, "
        "attrs MAP<STRING,BIGINT>"
    )
    fmt = TopicFormat(table_schema(columns, "id"), "json", "avro", SCHEMA)
    doc = order(5)
    assert fmt.read_value({"id": 5}, framed(doc)) == {
        "id": 5,
        "qty": -5,
        "ratio": 0.5,
        "price": Decimal("-1234567.89"),
        "ship": {"city": "Zürich"},
        "attrs": [("x", 1), ("y", -(2**63))],
    }
    not_null = TopicFormat(
        table_schema("id BIGINT, note STRING NOT NULL", "id"), "json", "avro", SCHEMA
    )
    with pytest.raises(BadValue, match="'note' is NOT NULL"):
        not_null.read_value({"id": 6}, avro(order(6, note=None)))


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        ("id BIGINT, missing STRING", "column 'missing' is not a field of value_schema's record"),
        ("id BIGINT, qty SMALLINT", "column 'qty' is smallint but field 'qty'.* is int"),
        ("id BIGINT, note BIGINT", "column 'note' is bigint but field 'note'.* is string"),
        ("id BIGINT, price DECIMAL(9,3)", "is decimal\\(9,3\\) but .* is decimal\\(9,2\\)"),
        ("id BIGINT, ship STRUCT<town: STRING>", "column 'ship' is struct<town:string>"),
    ],
)
def test_columns_that_do_not_match_the_schema(columns: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        TopicFormat(table_schema(columns, "id"), "json", "avro", SCHEMA)


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (None, "value_format='avro' needs value_schema="),
        ("{not json", "value_schema: not JSON"),
        ('"string"', "must be an Avro record"),
        ({"type": "record", "name": "E", "fields": []}, "record 'E' has no fields"),
        (
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]},
            "not a valid Avro schema",
        ),
        (
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": ["int", "string"]}]},
            "R.a is the union",
        ),
        (
            {"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]},
            "recursive records",
        ),
        (
            {
                "type": "record",
                "name": "R",
                "fields": [
                    {
                        "name": "d",
                        "type": {
                            "type": "bytes",
                            "logicalType": "decimal",
                            "precision": 40,
                            "scale": 0,
                        },
                    }
                ],
            },
            "precision 40",
        ),
    ],
)
def test_bad_schemas_get_clear_errors(schema: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        avro_columns(schema)


def test_a_key_column_must_be_a_field_without_columns() -> None:
    with pytest.raises(ConfigError, match=r"key column 'user' is not a field of .*'shop\.Order'"):
        avro_columns(SCHEMA, ["user"])


def test_value_schema_belongs_to_avro() -> None:
    with pytest.raises(ConfigError, match="value_schema= is the schema of Avro values"):
        TopicFormat(table_schema("id BIGINT, note STRING", "id"), "json", "json", SCHEMA)


def test_a_known_framing_is_read_without_guessing() -> None:
    schema = {
        "type": "record",
        "name": "Z",
        "fields": [
            {"name": "z", "type": "int"},
            {"name": "n", "type": ["null", "long"]},
            {"name": "s", "type": "string"},
        ],
    }
    table = table_schema("k STRING, z INT, n BIGINT, s STRING", "k")
    doc = {"z": 0, "n": None, "s": "\x00" * 5}
    plain = avro(
        doc, schema
    )  # 00 00 0a 00 00 00 00 00: from the 6th byte, the record (0, null, "")
    guessed = TopicFormat(table, "json", "avro", schema).read_value({"k": "a"}, plain)
    assert guessed == {"k": "a", "z": 0, "n": None, "s": ""}  # the documented misreading
    known = TopicFormat(table, "json", "avro-plain", schema)
    assert known.read_value({"k": "a"}, plain) == {"k": "a", **doc}
    with pytest.raises(BadValue, match="left over"):
        known.read_value({"k": "a"}, framed(doc, 1, schema))
    confluent = TopicFormat(table, "json", "avro-confluent", schema)
    assert confluent.read_value({"k": "a"}, framed(doc, 1, schema)) == {"k": "a", **doc}
    with pytest.raises(BadValue, match="no Confluent header"):
        confluent.read_value({"k": "a"}, avro({"z": 1, "n": 2, "s": "x"}, schema))


def test_the_cli_spec_takes_a_schema_inline_or_from_a_file(tmp_path: Path) -> None:
    import urllib.parse

    from sparkiq.serving.topic import parse_topic_spec

    text = json.dumps(SCHEMA)
    spec = parse_topic_spec(f"t?key=id&value_schema={urllib.parse.quote(text)}")
    assert json.loads(spec.value_schema or "") == SCHEMA and spec.value_format is None
    missing = tmp_path / "none.avsc"
    with pytest.raises(ConfigError, match=r"cannot read value_schema @.*none\.avsc"):
        parse_topic_spec(f"t?key=id&value_format=avro&value_schema=@{missing}")
