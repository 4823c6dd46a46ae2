"""The Flight SQL endpoint's life: ``sparkiq serve`` with it set by its variable
(``SPARKIQ_FLIGHT_LISTEN``, port 0) prints where it listens and ADBC's driver queries there
with the node's token; ``Node.stop`` ends it even while a client holds a stream."""

from __future__ import annotations

import re
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow.flight as flight

from sparkiq import Node
from sparkiq.server.flight.protocol import message, pack
from tests import forked_python
from tests.server.serve_subprocess import serving
from tests.sql.tables import build_world

TOKEN = "flight-serve-secret"
PRINTED = re.compile(r"Arrow Flight SQL on (grpc://127\.0\.0\.1:\d+)")


def test_serve_prints_the_address_and_answers_there(tmp_path: Path) -> None:
    build_world(str(tmp_path / "state"))
    log = tmp_path / "node.log"

    def printed(_: forked_python.Process) -> bool:
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


def test_stop_does_not_wait_for_a_client_that_stopped_reading(tmp_path: Path) -> None:
    """pyarrow's shutdown waits for every call in flight, with no bound: a client that
    reads one batch of a large result and no more would hold ``Node.stop`` forever."""
    build_world(str(tmp_path))
    node = Node(
        str(tmp_path),
        store="memory",
        flight_listen="127.0.0.1:0",
        sql_limits={"max_result_rows": 2_000_000},
    ).start()
    try:
        node.poll_once()
        assert node.flight_address is not None
        client = flight.connect(f"grpc://127.0.0.1:{node.flight_address[1]}")
        sql = "SELECT a.k, b.k AS k2, a.n FROM t a, t b, t c LIMIT 600000"  # 14 MB
        command = pack(message("CommandStatementQuery", query=sql))
        info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
        reader = client.do_get(info.endpoints[0].ticket)
        assert reader.read_chunk().data.num_rows > 0
    finally:
        started = time.monotonic()
        node.stop()
        took = time.monotonic() - started
    assert took < 60, f"Node.stop took {took:.0f} s"  # 5 s of grace, on a loaded machine
