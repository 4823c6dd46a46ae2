"""Running fuzz cases against a real node and judging the answers (shared by the bounded
tests here and ``bench/fuzz.py``).

A case passes when the node answers below 500, every error body says what went wrong
(``error.code`` and ``error.message``) without a filesystem path or a Python class name,
and a generated (not mutated) statement the node answers gives DuckDB's rows over the
ground truth (as a multiset; statements with ``LIMIT`` are not compared, since ties make
them choose).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb
import httpx

from sparkiq.wire import jsonapi
from tests import http_calls
from tests.fuzz.sqlgen import statement
from tests.sql.compare import normalize, postgres_names

LEAKS = ("Traceback", "sqlglot.", "duckdb.", "<class ", "/tmp/", "pytest-of")


@dataclass
class FuzzReport:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    compared: int = 0
    server_errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.server_errors + self.mismatches + self.leaks


def judge_error(report: FuzzReport, what: str, response: httpx.Response) -> None:
    """A 4xx/5xx answer: counted, and checked for a code, a message and no leaks."""
    if response.status_code >= 500:
        report.server_errors.append(f"{what} -> {response.status_code} {response.text[:300]}")
        return
    try:
        error = response.json()["error"]
        assert error["code"] and error["message"]
    except (ValueError, KeyError, TypeError, AssertionError):
        if response.status_code not in (401, 404, 405):
            report.leaks.append(f"{what} -> {response.status_code} without an error body")
        return
    for leak in LEAKS:
        if leak in error["message"]:
            report.leaks.append(f"{what} -> {leak!r} in {error['message'][:300]}")


def sql_fuzz(
    base_url: str,
    token: str,
    ground: duckdb.DuckDBPyConnection,
    *,
    seed: int,
    cases: int,
    budget_seconds: float,
) -> FuzzReport:
    """``cases`` statements from ``seed`` (fewer if ``budget_seconds`` runs out first)."""
    rng = random.Random(seed)
    report = FuzzReport()
    deadline = time.monotonic() + budget_seconds
    headers = {"authorization": f"Bearer {token}"}
    with http_calls.new_client(base_url=base_url, headers=headers, timeout=60) as client:
        for _ in range(cases):
            if time.monotonic() > deadline:
                break
            case = statement(rng)
            started = time.monotonic()
            response = client.post("/query", json={"sql": case.sql})
            report.latencies.append(time.monotonic() - started)
            report.cases += 1
            report.statuses[response.status_code] += 1
            if response.status_code != 200:
                judge_error(report, case.sql, response)
                continue
            if case.exact and " LIMIT " not in case.sql.upper():
                _compare(report, ground, case.sql, response.json())
    return report


def _compare(
    report: FuzzReport, ground: duckdb.DuckDBPyConnection, sql: str, doc: dict[str, Any]
) -> None:
    try:
        cursor = ground.execute(sql)
        # DuckDB's values; the names Postgres gives, as the node does (docs/sql.md)
        names = postgres_names([d[0] for d in cursor.description or ()])
        rows = cursor.fetchall()
    except duckdb.Error as exc:
        report.mismatches.append(f"{sql} -> 200 from the node, DuckDB failed: {exc}"[:600])
        return
    report.compared += 1
    # through the node's own JSON encoding, so both sides have the same types
    want_doc = json.loads(jsonapi.dumps([dict(zip(names, r, strict=True)) for r in rows]))
    got = sorted(repr(normalize([row[c] for c in doc["columns"]])) for row in doc["rows"])
    want = sorted(repr(normalize([row[c] for c in names])) for row in want_doc)
    if doc["columns"] != names or got != want:
        report.mismatches.append(
            f"{sql} -> node {doc['columns']} {got[:5]} vs DuckDB {names} {want[:5]}"[:800]
        )
