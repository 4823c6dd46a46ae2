"""Following a topic of Avro values (value_format="avro"), against a real broker.

The topic is keyed the way ksqlDB keys a table (``key_format="kafka"``: the raw UTF-8
string) and holds Avro values in Confluent's wire format (an arbitrary schema id, no
registry) and plain, as a mix: inserts, updates, tombstones, nulls, logical types, and
records that do not decode with the schema. Ground truth: the last acknowledged record of
every key that decodes, read here with fastavro's reader, independently of the follower."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import struct
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

import sparkiq
from sparkiq import KeyQuery, Node, PositionBound, StateQueryRequest
from sparkiq.errors import ConfigError
from sparkiq.serving.topic import parse_topic_spec
from tests.kafka.client import Delivered
from tests.kafka.topics import create_compacted, send

DEADLINE = 120.0  # a busy machine: generous, the condition ends the wait
SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Account",
    "namespace": "bank",
    "fields": [
        {"name": "user", "type": "string"},
        {
            "name": "balance",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "txns", "type": "long"},
        {"name": "nickname", "type": ["null", "string"], "default": None},
        {"name": "opened", "type": {"type": "int", "logicalType": "date"}},
        {"name": "updated", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "closed", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "limits", "type": {"type": "map", "values": ["null", "double"]}},
        {
            "name": "branch",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Branch",
                    "fields": [{"name": "city", "type": "string"}, {"name": "no", "type": "int"}],
                },
            ],
        },
    ],
}
PARSED = parse_schema(SCHEMA)
NEWER = parse_schema({**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "x", "type": "long"}]})
SCHEMA_ID = 0x01020304


def account(user: str, round_: int) -> dict[str, Any]:
    n = int(user[2:])
    return {
        "user": user,
        "balance": Decimal(f"{n * 100 + round_}.{round_:02d}") * (-1 if n % 5 == 0 else 1),
        "txns": round_ * 1000 + n,
        "nickname": None if n % 3 == 0 else f"{user}-r{round_}-ü",
        "opened": dt.date(2020, 1, 1) + dt.timedelta(days=n),
        "updated": dt.datetime(2026, 11, 29, 1, round_, n % 60, 123456, tzinfo=dt.UTC),
        "closed": None if round_ == 0 else dt.datetime(2026, 12, 1, 0, 0, n, tzinfo=dt.UTC),
        "tags": [f"t{i}" for i in range(n % 3)],
        "limits": {"daily": float(n), "none": None} if n % 2 else {},
        "branch": None if n % 4 == 0 else {"city": "Zürich", "no": n},
    }


def encode(doc: dict[str, Any], framed: bool, schema: Any = PARSED) -> bytes:
    out = io.BytesIO()
    if framed:
        out.write(b"\x00" + struct.pack(">I", SCHEMA_ID))
    schemaless_writer(out, schema, doc)
    return out.getvalue()


def decode(value: bytes, framed: bool) -> dict[str, Any]:
    """The test's own reading of a record it wrote: fastavro, header stripped when framed."""
    stream = io.BytesIO(value[5:] if framed else value)
    doc: dict[str, Any] = schemaless_reader(stream, PARSED, None)
    return doc


def served(doc: dict[str, Any]) -> dict[str, Any]:
    """A decoded record as a query answers it (PySpark's values: naive local timestamps,
    maps as dicts)."""
    row = dict(doc)
    for column in ("updated", "closed"):
        if row[column] is not None:
            row[column] = row[column].astimezone().replace(tzinfo=None)
    return row


@dataclass
class Sent:
    delivered: Delivered
    framed: bool
    good: bool  # written with the schema (False: a record the follower must skip)


@dataclass
class Accounts:
    topic: str
    sent: list[Sent]


@pytest.fixture(scope="module")
def accounts(kafka_cluster: Any) -> Accounts:
    """40 accounts inserted, 20 updated, 6 deleted, 3 records that do not decode."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = f"accounts-{uuid.uuid4().hex[:8]}"
    create_compacted(bootstrap, topic, 3)
    users = [f"u-{n}" for n in range(40)]
    plan: list[tuple[str, bytes | None, bool, bool]] = []  # key, value, framed, good
    for i, user in enumerate(users):
        plan.append((user, encode(account(user, 0), i % 2 == 0), i % 2 == 0, True))
    for i, user in enumerate(users[::2]):
        plan.append((user, encode(account(user, 1), i % 3 != 0), i % 3 != 0, True))
    for user in users[3::7]:
        plan.append((user, None, False, True))
    plan.append(("u-1", b"\x00\x00\x00\x00\x01garbage", True, False))  # u-1 keeps round 0
    plan.append(("u-2", encode({**account("u-2", 9), "x": 7}, True, NEWER), True, False))
    plan.append(("u-99", b'{"user": "u-99"}', False, False))  # JSON: never a row
    delivered = send(bootstrap, topic, [(k.encode(), v) for k, v, _, _ in plan])
    return Accounts(topic, [Sent(d, f, g) for d, (_, _, f, g) in zip(delivered, plan, strict=True)])


def expected(accounts: Accounts) -> dict[str, dict[str, Any] | None]:
    """Every key's last acknowledged record (in offset order) that decodes; None: deleted."""
    out: dict[str, dict[str, Any] | None] = {}
    for s in sorted(accounts.sent, key=lambda s: (s.delivered.partition, s.delivered.offset)):
        assert s.delivered.key is not None
        user = s.delivered.key.decode()
        value = s.delivered.value
        if not s.good:
            out.setdefault(user, None)
            continue
        out[user] = None if value is None else served(decode(value, s.framed))
    return out


def bound(accounts: Accounts) -> PositionBound:
    return PositionBound.after(
        *[(s.delivered.topic, s.delivered.partition, s.delivered.offset) for s in accounts.sent]
    )


def test_every_key_holds_its_last_record_that_decodes(
    kafka_bootstrap: str, accounts: Accounts, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="sparkiq.topic")
    with sparkiq.follow_topic(
        kafka_bootstrap,
        accounts.topic,
        name="accounts",
        key="user",
        key_format="kafka",
        value_format="avro",
        value_schema=SCHEMA,
        store="memory",
    ) as followed:
        want = expected(accounts)
        assert sum(v is None for v in want.values()) == 7 and len(want) == 41
        assert want["u-1"] is not None and want["u-1"]["txns"] == 1  # round 0 kept
        for user, row in want.items():
            # bounded by every acknowledged record: the key's partition has applied them all
            answer = followed.query(
                StateQueryRequest.in_store("accounts")
                .with_query(KeyQuery.with_key(user))
                .with_position_bound(bound(accounts))
            ).only_partition_result()
            assert answer.is_success, answer
            assert answer.result == row, user
        assert followed.source.malformed == 3 and followed.source.misplaced == 0
        rows = followed.sql(
            "SELECT count(*) AS n, sum(balance) AS total, sum(txns) AS txns, "
            "count(nickname) AS named, count(branch.city) AS branched "
            "FROM accounts WHERE opened >= DATE '2020-01-05'",
            bound=bound(accounts),  # every partition read has applied every record
        ).rows
        live = [r for r in want.values() if r is not None and r["opened"] >= dt.date(2020, 1, 5)]
        got = rows[0] if isinstance(rows[0], dict) else rows[0].asDict()
        assert got == {
            "n": len(live),
            "total": sum(r["balance"] for r in live),
            "txns": sum(r["txns"] for r in live),
            "named": sum(r["nickname"] is not None for r in live),
            "branched": sum(r["branch"] is not None for r in live),
        }
    bad = [s.delivered for s in accounts.sent if not s.good]
    logged = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    for d in bad:
        where = f"topic {accounts.topic!r} partition {d.partition} offset {d.offset}:"
        assert any(m.startswith(where) for m in logged), (where, logged)


def test_the_cli_spec_with_a_schema_file_and_some_columns(
    kafka_bootstrap: str, accounts: Accounts, tmp_path: Path
) -> None:
    schema_file = tmp_path / "account.avsc"
    schema_file.write_text(json.dumps(SCHEMA))
    spec = parse_topic_spec(
        f"acc={accounts.topic}?key=user&key_format=kafka&value_format=avro"
        f"&value_schema=@{schema_file}&columns=user STRING, txns BIGINT, branch STRUCT<no: BIGINT>"
    )
    assert spec.value_schema == json.dumps(SCHEMA)
    node = Node(
        str(tmp_path / "state"), store="memory", kafka_bootstrap=kafka_bootstrap, topics=[spec]
    )  # what `sparkiq serve --follow-topic SPEC` runs
    with node.start():
        want = {
            u: {"user": u, "txns": r["txns"], "branch": r["branch"] and {"no": r["branch"]["no"]}}
            for u, r in expected(accounts).items()
            if r is not None
        }
        rows = node.sql("SELECT user, txns, branch FROM acc", bound=bound(accounts)).rows
        assert {r["user"]: r for r in map(_as_dict, rows)} == want


def _as_dict(row: Any) -> dict[str, Any]:
    return row if isinstance(row, dict) else row.asDict(recursive=True)


def test_schemas_that_do_not_fit_are_refused_when_following(
    kafka_bootstrap: str, accounts: Accounts
) -> None:
    def follow(**options: Any) -> None:
        options.setdefault("key", "user")
        sparkiq.follow_topic(
            kafka_bootstrap, accounts.topic, key_format="kafka", store="memory", **options
        ).close()

    with pytest.raises(ConfigError, match="value_format='avro' needs value_schema="):
        follow(value_format="avro")
    with pytest.raises(ConfigError, match="value_schema: not JSON"):
        follow(value_format="avro", value_schema="{'type': 'record'}")
    with pytest.raises(ConfigError, match="column 'txns' is int but field 'txns'"):
        follow(value_schema=SCHEMA, columns="user STRING, txns INT")
    with pytest.raises(ConfigError, match="key column 'id' is not a field"):
        follow(value_schema=SCHEMA, key="id")
