"""TLS on the Postgres endpoint (issue 25): psql, psycopg, asyncpg and pg8000 connect with
``verify-full`` to a node whose certificate comes from a CA made at test time (trustme);
a client that does not trust that CA, or that does not ask for TLS, gets nothing; a renewed
certificate is presented from the next connection on; a client stalled in the handshake
holds its slot no longer than the login deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pg8000.native
import psycopg
import pytest
import trustme

from sparkiq import Node
from tests.changelog.helpers import make_table, write_batch

pytestmark = pytest.mark.timeout(180)

TOKEN = "pg-tls-token"
ROWS = {f"k{i}": i * 7 for i in range(12)}
QUERY = "SELECT k, n FROM t ORDER BY k"
STARTUP_TIMEOUT = 3.0


def _issue(ca: trustme.CA, where: Path) -> dict[str, str]:
    """A certificate for 127.0.0.1 and localhost signed by ``ca``, (over)written as the
    node's TLS files; the CA's own certificate as ``ca``."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(where / "node.crt"))
    cert.private_key_pem.write_to_path(str(where / "node.key"))
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    return {
        "tls_cert": str(where / "node.crt"),
        "tls_key": str(where / "node.key"),
        "ca": str(where / "ca.pem"),
    }


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def _start(
    where: Path, authority: trustme.CA, limits: dict[str, str] | None = None, **settings: Any
) -> tuple[Node, str]:
    """A standalone node serving table ``t`` (:data:`ROWS`) over Postgres with TLS, with
    ``limits`` as ``SPARKIQ_PG_*`` variables; its CA file."""
    state_dir = str(where / "state")
    write_batch(make_table(state_dir, partitions=2), 0, ROWS)
    files = _issue(authority, where)
    ca = files.pop("ca")
    limits = {"STARTUP_TIMEOUT": str(STARTUP_TIMEOUT)} | (limits or {})
    with pytest.MonkeyPatch.context() as env:
        for name, value in limits.items():
            env.setenv(f"SPARKIQ_PG_{name}", value)
        node = Node(
            state_dir, store="memory", node_id="pgtls", token=TOKEN, pg_listen="127.0.0.1:0",
            **files, **settings,
        ).start()  # fmt: skip
    node.poll_once()
    return node, ca


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, authority: trustme.CA
) -> Iterator[tuple[Node, str]]:
    node, ca = _start(tmp_path_factory.mktemp("pgtls"), authority)
    yield node, ca
    node.stop()


def _dsn(node: Node, **options: str) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    words = {"host": host, "port": str(port), "user": "tester", "dbname": "sparkiq"}
    words |= {"password": TOKEN, "connect_timeout": "20"} | options
    return " ".join(f"{k}={v}" for k, v in words.items())


def _expected(node: Node) -> list[tuple[Any, ...]]:
    rows = node.sql(QUERY).tuples()
    assert rows == sorted(ROWS.items())  # the node has read the batch
    return rows


# -- clients with verify-full -------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (postgresql-client) not installed")
def test_psql_connects_with_verify_full(served: tuple[Node, str]) -> None:
    node, ca = served
    dsn = _dsn(node, sslmode="verify-full", sslrootcert=ca)
    dsn = dsn.replace(f" password={TOKEN}", "")  # psql takes it from PGPASSWORD
    env = dict(os.environ, PGPASSWORD=TOKEN)
    done = subprocess.run(
        ["psql", "-X", "-A", "-t", "-F", "|", "-c", "\\conninfo", "-c", QUERY, dsn],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    conninfo, *lines = done.stdout.splitlines()
    assert 'as user "tester"' in conninfo
    assert lines[0].startswith("SSL connection (protocol: TLSv1."), lines
    rows = [tuple(line.split("|")) for line in lines[1:]]
    assert rows == [(k, str(n)) for k, n in _expected(node)]


def test_psycopg_connects_with_verify_full(served: tuple[Node, str]) -> None:
    node, ca = served
    with psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca)) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute(QUERY).fetchall() == _expected(node)
        # the extended protocol too, with a parameter
        rows = conn.execute("SELECT n FROM t WHERE k = %s", ["k3"]).fetchall()
        assert rows == [(21,)]


def test_asyncpg_connects_with_a_verifying_context(served: tuple[Node, str]) -> None:
    node, ca = served
    assert node.pg_address is not None
    host, port = node.pg_address

    async def fetch() -> tuple[list[tuple[Any, ...]], object]:
        conn = await asyncpg.connect(
            host=host, port=port, user="tester", password=TOKEN, database="sparkiq",
            ssl=ssl.create_default_context(cafile=ca),
        )  # fmt: skip
        try:
            records = await conn.fetch(QUERY)
            sslobject = conn._transport.get_extra_info("ssl_object")
            return [tuple(r) for r in records], sslobject
        finally:
            await conn.close()

    rows, sslobject = asyncio.run(fetch())
    assert isinstance(sslobject, ssl.SSLObject)
    assert rows == _expected(node)


def test_pg8000_connects_with_a_verifying_context(served: tuple[Node, str]) -> None:
    node, ca = served
    assert node.pg_address is not None
    host, port = node.pg_address
    context = ssl.create_default_context(cafile=ca)
    conn = pg8000.native.Connection(
        "tester", host=host, port=port, password=TOKEN, database="sparkiq", ssl_context=context
    )
    try:
        assert isinstance(conn._usock, ssl.SSLSocket)
        assert [tuple(r) for r in conn.run(QUERY)] == _expected(node)
    finally:
        conn.close()


# -- what is refused --------------------------------------------------------------------------


def test_a_client_that_does_not_trust_the_nodes_ca_fails_verification(
    served: tuple[Node, str], tmp_path: Path
) -> None:
    node, ca = served
    stranger = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=str(stranger)))
    # nor does a certificate for 127.0.0.1 and localhost pass for another name
    other = _dsn(
        node, sslmode="verify-full", sslrootcert=ca, host="node.example", hostaddr="127.0.0.1"
    )
    with pytest.raises(psycopg.OperationalError, match=r'does not match host name "node\.example"'):
        psycopg.connect(other)
    with psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca)) as conn:
        assert conn.execute(QUERY).fetchall() == _expected(node)


def test_a_plain_client_is_told_to_use_tls(served: tuple[Node, str]) -> None:
    """TLS is required by default on a node with TLS: a client that does not ask for it is
    refused before any password exchange, with SQLSTATE 28000 and what to do."""
    node, _ = served
    with pytest.raises(psycopg.OperationalError) as refused:  # libpq keeps no SQLSTATE here
        psycopg.connect(_dsn(node, sslmode="disable"))
    message = str(refused.value)
    assert "accepts Postgres connections over TLS only" in message, message
    assert "sslmode=require or stronger" in message, message
    assert node.pg_address is not None
    host, port = node.pg_address
    with pytest.raises(pg8000.exceptions.DatabaseError) as plain:
        # False: no SSLRequest (pg8000's default asks for TLS without verifying anything)
        pg8000.native.Connection("tester", host=host, port=port, password=TOKEN, ssl_context=False)
    assert plain.value.args[0]["C"] == "28000"
    assert "sslmode=require or stronger" in plain.value.args[0]["M"]


def test_with_pg_tls_optional_plain_clients_get_in_too(
    tmp_path: Path, authority: trustme.CA
) -> None:
    node, ca = _start(tmp_path, authority, pg_tls="optional")
    try:
        with psycopg.connect(_dsn(node, sslmode="disable")) as conn:
            assert not conn.pgconn.ssl_in_use
            assert conn.execute(QUERY).fetchall() == _expected(node)
        with psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca)) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute(QUERY).fetchall() == _expected(node)
    finally:
        node.stop()


# -- the negotiation by hand --------------------------------------------------------------------

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_GSSENC_REQUEST = struct.pack("!ii", 8, 80877104)


def _startup_message(user: str = "tester") -> bytes:
    body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0sparkiq\0\0"
    return struct.pack("!i", len(body) + 4) + body


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the node closes the connection (fails if it stays open and
    silent for the socket's timeout)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"the node left the connection open (after {data!r})") from None
    except OSError:  # a reset counts as closed too
        pass
    return data


def _peer_certificate(node: Node, ca: str) -> bytes:
    """The certificate (DER) the node presents to a Postgres client now: an SSLRequest
    sent by hand, then a handshake verified against ``ca``."""
    assert node.pg_address is not None
    with socket.create_connection(node.pg_address, timeout=30) as sock:
        sock.sendall(_SSL_REQUEST)
        assert sock.recv(1) == b"S"
        context = ssl.create_default_context(cafile=ca)
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_gssenc_is_declined_then_tls_accepted_and_a_repeat_refused(
    served: tuple[Node, str],
) -> None:
    """libpq's order with gssencmode=prefer: GSSEncRequest (declined), then SSLRequest
    (accepted) on the same connection. Asking for TLS again inside TLS is a protocol
    violation."""
    node, ca = served
    assert node.pg_address is not None
    with socket.create_connection(node.pg_address, timeout=30) as sock:
        sock.sendall(_GSSENC_REQUEST)
        assert sock.recv(1) == b"N"
        sock.sendall(_SSL_REQUEST)
        assert sock.recv(1) == b"S"
        context = ssl.create_default_context(cafile=ca)
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            tls.sendall(_SSL_REQUEST)
            answer = _read_all(tls)
    assert answer.startswith(b"E") and b"C08P01\0" in answer, answer
    assert b"SSLRequest sent twice" in answer


def test_plain_bytes_sent_after_the_ssl_request_are_never_read_as_the_session(
    served: tuple[Node, str],
) -> None:
    """A startup message sent in the same packet as the SSLRequest, before any handshake
    (what someone between client and node could inject, CVE-2021-23214 in Postgres), is
    not taken as the start of the encrypted session: the handshake fails on it and the
    connection ends without a word in clear text beyond the ``S``."""
    node, _ = served
    assert node.pg_address is not None
    with socket.create_connection(node.pg_address, timeout=30) as sock:
        sock.sendall(_SSL_REQUEST + _startup_message())
        answer = _read_all(sock)
    assert answer[:1] == b"S"
    rest = answer[1:]
    assert rest == b"" or rest[0] == 0x15, answer  # at most a TLS alert: no auth, no error


def test_a_renewed_certificate_is_what_the_next_connection_sees(
    tmp_path: Path, authority: trustme.CA
) -> None:
    node, ca = _start(tmp_path, authority)
    try:
        first = _peer_certificate(node, ca)
        assert first == ssl.PEM_cert_to_DER_cert(Path(tmp_path / "node.crt").read_text())
        before = psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca))
        _issue(authority, tmp_path)  # overwrites node.crt and node.key
        assert node._tls is not None
        assert node._tls.reload_if_changed()
        second = _peer_certificate(node, ca)
        assert second == ssl.PEM_cert_to_DER_cert(Path(tmp_path / "node.crt").read_text())
        assert second != first
        with psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca)) as conn:
            assert conn.execute(QUERY).fetchall() == _expected(node)
        with before:  # a connection opened before keeps its session
            assert before.execute(QUERY).fetchall() == _expected(node)
    finally:
        node.stop()


# -- Postgres 17's direct TLS (sslnegotiation=direct) -------------------------------------------


def test_libpq_and_asyncpg_connect_with_direct_tls(served: tuple[Node, str]) -> None:
    """No SSLRequest: the handshake first, with the ALPN protocol "postgresql" (libpq 17+
    with sslnegotiation=direct, asyncpg with direct_tls)."""
    node, ca = served
    dsn = _dsn(node, sslmode="verify-full", sslrootcert=ca, sslnegotiation="direct")
    with psycopg.connect(dsn) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute(QUERY).fetchall() == _expected(node)
    assert node.pg_address is not None
    host, port = node.pg_address

    async def fetch() -> list[tuple[Any, ...]]:
        # asyncpg offers the ALPN protocol on contexts it makes (sslmode in the DSN), not
        # on an SSLContext passed in, which would need set_alpn_protocols(["postgresql"])
        url = f"postgresql://tester@{host}:{port}/sparkiq?sslmode=verify-full&sslrootcert={ca}"
        conn = await asyncpg.connect(url, password=TOKEN, direct_tls=True)
        try:
            return [tuple(r) for r in await conn.fetch(QUERY)]
        finally:
            await conn.close()

    assert asyncio.run(fetch()) == _expected(node)


@pytest.mark.parametrize("alpn", [None, ["http/1.1"]], ids=["no-alpn", "http"])
def test_a_direct_handshake_without_the_postgres_alpn_is_refused(
    served: tuple[Node, str], alpn: list[str] | None
) -> None:
    """A TLS client of another protocol (or of none) that reaches the endpoint is not
    taken for a Postgres client: the node does not select its protocol and ends the
    connection with 08P01 once the handshake is done."""
    node, ca = served
    assert node.pg_address is not None
    context = ssl.create_default_context(cafile=ca)
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    with (
        socket.create_connection(node.pg_address, timeout=30) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.selected_alpn_protocol() is None
        tls.sendall(_startup_message())
        answer = _read_all(tls)
    assert answer.startswith(b"E") and b"C08P01\0" in answer, answer
    assert b"must negotiate the ALPN protocol 'postgresql'" in answer


def test_a_direct_handshake_at_a_node_without_tls_is_refused_at_once(tmp_path: Path) -> None:
    state_dir = str(tmp_path / "state")
    write_batch(make_table(state_dir, partitions=2), 0, ROWS)
    node = Node(state_dir, store="memory", token=TOKEN, pg_listen="127.0.0.1:0").start()
    try:
        assert node.pg_address is not None
        with socket.create_connection(node.pg_address, timeout=30) as sock:
            sock.sendall(_client_hello())
            answer = _read_all(sock)  # not left waiting for 360 MB of "startup message"
        assert answer.startswith(b"E") and b"C08P01\0" in answer, answer
        assert b"this node has no TLS certificate" in answer
        with socket.create_connection(node.pg_address, timeout=30) as sock:
            sock.sendall(_SSL_REQUEST)  # and without TLS an SSLRequest is declined, as before
            assert sock.recv(1) == b"N"
    finally:
        node.stop()


def _client_hello() -> bytes:
    """The first flight of a real TLS client, to trickle at the node."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="x")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_a_client_stalled_in_the_handshake_is_dropped_at_the_login_deadline(
    served: tuple[Node, str],
) -> None:
    """A client that sends an SSLRequest, then its ClientHello a byte every 0.2 s (never a
    long silence, so no timeout per read would ever end it), is closed once the login
    deadline passes; meanwhile a real client logs in over TLS."""
    node, ca = served
    assert node.pg_address is not None
    hello = _client_hello()
    assert len(hello) > 100  # at 5 bytes a second: far longer than the deadline
    closed = threading.Event()
    sent = 0

    def trickle(sock: socket.socket) -> None:
        nonlocal sent
        try:
            while sent < len(hello) and not closed.is_set():
                sock.sendall(hello[sent : sent + 1])
                sent += 1
                time.sleep(0.2)
        except OSError:  # the node closed the connection
            pass

    with socket.create_connection(node.pg_address, timeout=60) as sock:
        sock.sendall(_SSL_REQUEST)
        assert sock.recv(1) == b"S"
        writer = threading.Thread(target=trickle, args=(sock,), daemon=True)
        writer.start()
        with psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca)) as conn:
            assert conn.execute(QUERY).fetchall() == _expected(node)
        # the node ends it: recv() sees the end (a silence of 60 s fails the test; the
        # trickle alone would go on for len(hello) / 5 seconds)
        answer = _read_all(sock)
        closed.set()
        writer.join(30)
    assert answer == b"", answer  # no error in clear text to a client mid-handshake
    assert sent < len(hello), "the whole ClientHello went through before the node gave up"


def test_a_login_stalled_in_the_handshake_gives_its_slot_to_a_new_client(
    tmp_path: Path, authority: trustme.CA
) -> None:
    """With every login slot held by clients stalled in the TLS handshake (and a login
    deadline far off), a real client takes the oldest one's slot, as it would from a
    plain-text slow login: the stalled handshake is cut off from the listener's thread."""
    limits = {"STARTUP_TIMEOUT": "120", "MAX_UNAUTHENTICATED": "2", "EVICTION_SECONDS": "0.2"}
    node, ca = _start(tmp_path, authority, limits)
    try:
        assert node.pg_address is not None
        stalled = []
        for _ in range(2):
            sock = socket.create_connection(node.pg_address, timeout=60)
            sock.sendall(_SSL_REQUEST)
            assert sock.recv(1) == b"S"  # accepted: its login has begun
            stalled.append(sock)
        time.sleep(0.5)  # both are now older than the eviction age (ages only grow)
        with psycopg.connect(_dsn(node, sslmode="verify-full", sslrootcert=ca)) as conn:
            assert conn.execute(QUERY).fetchall() == _expected(node)
        assert _read_all(stalled[0]) == b""  # closed long before its 120 s deadline
        for sock in stalled:
            sock.close()
    finally:
        node.stop()
