"""``sparkiq serve`` with the Flight SQL endpoint set by its variable
(``SPARKIQ_FLIGHT_LISTEN``, port 0): it prints where it listens, and ADBC's driver queries
there with the node's token."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql

from sparkiq import Node
from tests.server.serve_subprocess import serving
from tests.sql.tables import build_world

TOKEN = "flight-serve-secret"
PRINTED = re.compile(r"Arrow Flight SQL on (grpc://127\.0\.0\.1:\d+)")


def test_serve_prints_the_address_and_answers_there(tmp_path: Path) -> None:
    build_world(str(tmp_path / "state"))
    log = tmp_path / "node.log"

    def printed(_: subprocess.Popen[bytes]) -> bool:
        return bool(PRINTED.search(log.read_text()))

    env = {"SPARKIQ_FLIGHT_LISTEN": "127.0.0.1:0", "SPARKIQ_TOKEN": TOKEN}
    args = ["--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"]
    with serving(args, tmp_path, printed, env=env, errors=(FileNotFoundError,)):
        match = PRINTED.search(log.read_text())
        assert match is not None
        options = {"username": "anyone", "password": TOKEN}
        with (
            flightsql.connect(match.group(1), db_kwargs=options, autocommit=True) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SELECT region, count(*) AS n FROM ck GROUP BY region ORDER BY 1")
            got = cur.fetch_arrow_table().to_pylist()
    with Node(str(tmp_path / "state"), store="memory") as node:
        node.poll_once()
        truth = node.sql("SELECT region, count(*) AS n FROM ck GROUP BY region ORDER BY 1")
    assert got == truth.to_arrow().to_pylist()
