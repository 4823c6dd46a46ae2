"""Golden statements (tests/sql/fixtures/pull.sql): rows, tier and path of every tier."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node

FIXTURES = Path(__file__).parent / "fixtures" / "pull.sql"


@dataclass
class Golden:
    name: str
    tier: int = -1
    path: str = ""
    sql: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)


def load(path: Path) -> list[Golden]:
    cases: list[Golden] = []
    for line in path.read_text().splitlines():
        if line.startswith("-- name: "):
            cases.append(Golden(line.removeprefix("-- name: ")))
        elif not cases or not line.strip():
            continue
        elif line.startswith("-- tier: "):
            cases[-1].tier = int(line.removeprefix("-- tier: "))
        elif line.startswith("-- path: "):
            cases[-1].path = line.removeprefix("-- path: ")
        elif line.startswith("-- columns: "):
            cases[-1].columns = json.loads(line.removeprefix("-- columns: "))
        elif line.startswith("-- row: "):
            cases[-1].rows.append(json.loads(line.removeprefix("-- row: ")))
        elif not line.startswith("--"):
            cases[-1].sql += line.rstrip(";")
    return cases


def plain(value: Any) -> Any:
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


CASES = load(FIXTURES)


def test_the_fixture_file_covers_every_tier() -> None:
    assert {c.tier for c in CASES} == {0, 1, 2, 3, 4}
    assert all(c.sql and c.columns and c.path in ("python", "duckdb") for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden(node: Node, case: Golden) -> None:
    result = node.sql(case.sql)
    assert result.columns == case.columns
    got = [[plain(row[c]) for c in result.columns] for row in result.rows]
    if "ORDER BY" in case.sql.upper():
        assert got == case.rows
    else:
        assert sorted(got, key=repr) == sorted(case.rows, key=repr)
    plan = node.sql("EXPLAIN " + case.sql).explain
    assert plan is not None
    assert (plan["tier"], plan["path"]) == (case.tier, case.path)
