"""The Flight SQL endpoint of a node with TLS: ``grpc+tls`` with the node's certificate
(from a CA made at test time, trustme), verified by ADBC's driver against that CA; a
plain-text client is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pytest
import trustme
from adbc_driver_flightsql import DatabaseOptions
from adbc_driver_manager import Error as AdbcError

from sparkiq import Node
from tests.sql.tables import build_world

TOKEN = "flight-tls-secret"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Path]]:
    where = tmp_path_factory.mktemp("flight-tls")
    build_world(str(where / "state"))
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(where / "node.crt"))
    cert.private_key_pem.write_to_path(str(where / "node.key"))
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    with Node(
        str(where / "state"),
        store="memory",
        node_id="ftls",
        token=TOKEN,
        flight_listen="127.0.0.1:0",
        tls_cert=str(where / "node.crt"),
        tls_key=str(where / "node.key"),
    ) as node:
        node.poll_once()
        yield node, where / "ca.pem"


def test_queries_over_tls_verified_against_the_ca(served: tuple[Node, Path]) -> None:
    node, ca = served
    assert node.flight_address is not None
    options = {
        "username": "me",
        "password": TOKEN,
        DatabaseOptions.TLS_ROOT_CERTS.value: ca.read_text(),
    }
    uri = f"grpc+tls://127.0.0.1:{node.flight_address[1]}"
    with flightsql.connect(uri, db_kwargs=options, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM ck ORDER BY region, id")
        got = cur.fetch_arrow_table()
    assert (
        got.to_pylist() == node.sql("SELECT * FROM ck ORDER BY region, id").to_arrow().to_pylist()
    )


def test_plain_text_and_unknown_authorities_are_refused(served: tuple[Node, Path]) -> None:
    node, _ = served
    assert node.flight_address is not None
    port = node.flight_address[1]
    plain = {"username": "me", "password": TOKEN}
    with (
        pytest.raises(AdbcError),
        flightsql.connect(f"grpc://127.0.0.1:{port}", db_kwargs=plain) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT 1 AS one")
    # the system's authorities do not know the test CA
    with (
        pytest.raises(AdbcError, match="certificate"),
        flightsql.connect(f"grpc+tls://127.0.0.1:{port}", db_kwargs=plain) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("SELECT 1 AS one")
