"""The Postgres endpoint against hostile clients (issue 25, "Trust"), through real clients.

Each test attacks a node's endpoint on 127.0.0.1 while a prober (a psycopg connection
logged in before the attack) runs a key lookup over and over; besides the attack being
refused, the prober's worst gap between two answers must stay within a second of an idle
core (:func:`tests.server.test_hostile.bound` scales it by the machine's load now). The
attacks come from other loopback addresses (127.0.0.2...) where the endpoint tells peers
apart by address, as an attacker on another host would.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pg8000.native
import psycopg
import pytest
from pygwire import FrontendConnection
from pygwire import messages as m

from sparkiq import Node
from sparkiq.server.pg.scram import ScramError, ScramExchange, ScramVerifier
from tests import forked_python, http_calls
from tests.cluster.serve_processes import free_port
from tests.server.serve_subprocess import serving
from tests.server.test_hostile import bound
from tests.sql.tables import build_world

pytestmark = pytest.mark.timeout(180)

TOKEN = "trust-token"
PROBE = "SELECT v FROM ik WHERE key = 1"  # ik holds keys -50, -47, ...: key 1's v is 17
STARTUP_TIMEOUT = 3.0
MIB = 1 << 20


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("pgtrust"))
    build_world(root)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKIQ_PG_STARTUP_TIMEOUT", str(STARTUP_TIMEOUT))
        n = Node(root, store="memory", node_id="pgtrust", token=TOKEN, pg_listen="127.0.0.1:0")
        n.start()
    n.poll_once()
    yield n
    n.stop()


@dataclass
class Served:
    """A ``sparkiq serve`` process with the Postgres endpoint (and HTTP, for /metrics)."""

    process: forked_python.Process
    url: str
    pg_address: tuple[str, int]
    log: Path

    def status(self, field: str) -> int:
        """A ``/proc/<pid>/status`` size (``VmRSS``, ``VmHWM``) in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc/{self.process.pid}/status")

    def reset_peak(self) -> None:
        """Make ``VmHWM`` start again from the current RSS (Linux's clear_refs 5)."""
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state_dir = tmp_path_factory.mktemp("pgtrust-serve")
    build_world(str(state_dir))
    cwd = tmp_path_factory.mktemp("pgtrust-cwd")
    port, pg_port = free_port(), free_port()
    args = [
        "--state-dir", str(state_dir), "--node-id", "n0", "--token", TOKEN,
        "--listen", f"127.0.0.1:{port}", "--pg-listen", f"127.0.0.1:{pg_port}",
    ]  # fmt: skip

    def node(process: forked_python.Process) -> Served:
        return Served(process, f"http://127.0.0.1:{port}", ("127.0.0.1", pg_port), cwd / "node.log")

    def ready(process: forked_python.Process) -> bool:
        # ready, and hosting every partition (a lone node takes them all)
        with psycopg.connect(_dsn(node(process)), autocommit=True) as conn:
            return bool(conn.execute(PROBE).fetchall() == [(17,)])

    with serving(args, cwd, ready, errors=(psycopg.Error,), interval=0.2) as process:
        yield node(process)


def _dsn(node: Node | Served, password: str = TOKEN) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    return (
        f"host={host} port={port} user=tester dbname=sparkiq password={password} connect_timeout=20"
    )


class Prober:
    """A logged-in psycopg connection running :data:`PROBE` in a thread until stopped;
    records the worst gap between two answers (and the first wrong answer or error)."""

    def __init__(self, node: Node | Served) -> None:
        self.conn = psycopg.connect(_dsn(node), autocommit=True)
        self.worst = 0.0
        self.answers = 0
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                rows = self.conn.execute(PROBE).fetchall()
            except psycopg.Error as exc:
                self.failure = f"{type(exc).__name__}: {exc}"
                return
            if rows != [(17,)]:
                self.failure = f"wrong answer {rows!r}"
                return
            now = time.monotonic()
            self.worst, last = max(self.worst, now - last), now
            self.answers += 1
            time.sleep(0.005)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.conn.close()

    def check(self, limit: float) -> None:
        assert self.failure is None, self.failure
        assert self.answers > 0
        assert self.worst < limit, f"the prober waited {self.worst:.2f} s for an answer"


def _from(source: str, address: tuple[str, int]) -> socket.socket:
    """A TCP connection to ``address`` from the loopback address ``source``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(address)
    return sock


def _startup_bytes(user: str) -> bytes:
    body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0sparkiq\0\0"
    return struct.pack("!i", len(body) + 4) + body


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset; an error message before it is
    read and dropped)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


# -- 1. slow startup ---------------------------------------------------------------------------


def test_slow_loris_logins_neither_lock_out_clients_nor_outlive_the_deadline(node: Node) -> None:
    """64 connections trickling a startup message a byte a second (the issue's attack held
    every slot with a byte every 5 s) neither keep a new psycopg client out nor stall a
    logged-in one, and each is closed once the login deadline passes, bytes or not."""
    assert node.pg_address is not None
    limit = bound()
    message = _startup_bytes("x" * 200)  # 200+ bytes: never complete at a byte a second
    server = node._pg
    assert server is not None
    with Prober(node) as prober:
        before = server.accepted
        loris: list[tuple[socket.socket, float]] = []
        for _ in range(64):
            sock = _from("127.0.0.2", node.pg_address)
            sock.sendall(message[:1])
            loris.append((sock, time.monotonic()))
        # Age is counted from when the server accepted a connection: on a loaded machine
        # that may be well after connect() returned here, so wait until it has taken all 64.
        taken_by = time.monotonic() + 60
        while server.accepted < before + 64:
            assert time.monotonic() < taken_by, "the server never accepted the connections"
            time.sleep(0.02)
        sent = 1
        open_ = [s for s, _ in loris if not _closed_by_peer(s)]
        assert len(open_) >= 16  # the attack holds slots for real
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # the loris connections age past eviction
            time.sleep(0.5)
            for sock in open_:
                with contextlib.suppress(OSError):
                    sock.sendall(message[sent : sent + 1])
            sent += 1

        started = time.monotonic()
        with psycopg.connect(_dsn(node), autocommit=True) as conn:
            assert conn.execute(PROBE).fetchall() == [(17,)]
        took = time.monotonic() - started
        assert took < limit, f"a real client took {took:.2f} s to connect and query"

        # Trickling on does not keep a loris connection open past the login deadline.
        ends = max(t for _, t in loris) + STARTUP_TIMEOUT + 2 * limit + 2
        while time.monotonic() < ends and not all(_closed_by_peer(s) for s in open_):
            for sock in open_:
                with contextlib.suppress(OSError):
                    sock.sendall(message[sent : sent + 1])
            sent += 1
            time.sleep(0.5)
        still_open = sum(not _closed_by_peer(s) for s in open_)
        for sock, _ in loris:
            sock.close()
    assert still_open == 0, f"{still_open} slow logins outlived the {STARTUP_TIMEOUT} s deadline"
    prober.check(limit)

    # Nor may a login be large: 20 KB of startup message is refused once 16 KiB arrived.
    with _from("127.0.0.2", node.pg_address) as sock:
        sock.sendall(_startup_bytes("x" * 20_000))
        answer = b""
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                answer += data
    assert answer.startswith(b"E") and b"C08P01\0" in answer, answer[:200]
    assert b"SPARKIQ_PG_MAX_STARTUP_BYTES=16384" in answer


# -- 2. Bind -----------------------------------------------------------------------------------


def test_a_bind_of_huge_binary_numerics_is_refused_before_it_costs_memory(served: Served) -> None:
    """The issue's Bind: 4,000 binary numerics of one digit with weight 32,767 (10 bytes
    each on the wire, 131,069 digits each as text) cost +559 MB. It is refused at the first
    one, naming it and the limit, and the node grows by a few MiB at most; a Bind whose
    literals together outgrow a statement is refused too; binary parameters that fit work
    (psycopg, asyncpg)."""
    limit = bound()
    placeholders = ", ".join(["%b"] * 4000)
    served.reset_peak()
    rss_before = served.status("VmRSS")
    with Prober(served) as prober, psycopg.connect(_dsn(served), autocommit=True) as conn:
        started = time.monotonic()
        with pytest.raises(psycopg.errors.ProgramLimitExceeded) as huge:
            conn.execute(f"SELECT {placeholders}", [Decimal("1e131068")] * 4000)
        took = time.monotonic() - started
        with pytest.raises(psycopg.errors.ProgramLimitExceeded) as long:
            conn.execute(f"SELECT {placeholders}", ["x" * 100] * 4000)
        assert conn.execute("SELECT v FROM ik WHERE key = %b", [Decimal(1)]).fetchall() == [(17,)]
        assert conn.execute("SELECT v FROM ik WHERE key = %b", [1]).fetchall() == [(17,)]
    growth = served.status("VmHWM") - rss_before
    message = huge.value.diag.message_primary or ""
    assert message.startswith("parameter $1: a numeric of 131072 digits before the point"), message
    assert "SPARKIQ_PG_MAX_NUMERIC_DIGITS=1000" in message
    message = long.value.diag.message_primary or ""
    assert "SqlLimits.max_statement_chars=100000" in message, message
    assert "(as far as $" in message
    assert took < limit, f"the refusal took {took:.2f} s"
    assert growth < 32 * MIB, f"the node grew {growth / MIB:.0f} MiB"

    async def prepared() -> list[int]:
        conn = await asyncpg.connect(
            host=served.pg_address[0],
            port=served.pg_address[1],
            user="tester",
            password=TOKEN,
            database="sparkiq",
        )
        try:
            statement = await conn.prepare("SELECT v FROM ik WHERE key = $1")
            return [(await statement.fetchval(k)) for k in (1, 4)]
        finally:
            await conn.close()

    assert asyncio.run(prepared()) == [17, 18]
    prober.check(limit)


# -- 3. wrong passwords ------------------------------------------------------------------------


def _metric(node: Served, name: str, listener: str) -> float:
    text = http_calls.get(
        f"{node.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
    ).text
    prefix = f'{name}{{listener="{listener}"}} '
    (line,) = [x for x in text.splitlines() if x.startswith(prefix)]
    return float(line.removeprefix(prefix))


CROWD = "127.0.0.7"


def _hammer_pg(node: Served, source: str, seconds: float) -> dict[str, int]:
    """Wrong passwords over new connections from ``source`` as fast as one thread can:
    SQLSTATE -> how many times it was answered."""
    outcomes: dict[str, int] = {}
    host, port = node.pg_address
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            pg8000.native.Connection(
                "tester", host=host, port=port, password="guess", source_address=(source, 0)
            ).close()
            code = "logged in"
        except pg8000.exceptions.DatabaseError as exc:
            code = exc.args[0]["C"]
        outcomes[code] = outcomes.get(code, 0) + 1
    return outcomes


def _hammer_http(node: Served, source: str, seconds: float) -> dict[str, int]:
    """Wrong bearer tokens from ``source``: "checked" (a 401 for the token) or "throttled"
    (a 401 that did not look at it) -> how many times."""
    outcomes: dict[str, int] = {}
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            response = client.get(
                f"{node.url}/stores/ik/keys/1", headers={"authorization": "Bearer guess"}
            )
            assert response.status_code == 401, response.text
            error = response.json()["error"]
            kind = "throttled" if "retry_after_seconds" in error else "checked"
            outcomes[kind] = outcomes.get(kind, 0) + 1
    return outcomes


def test_wrong_passwords_are_slowed_per_address_and_counted(served: Served) -> None:
    """One thread guessing passwords got 1,066 checked a second. Now an address gets a few
    guesses at full speed, then one per growing delay (a bar): every attempt while barred is
    refused unchecked (SQLSTATE 28000; HTTP 401 with retry_after_seconds). /metrics counts
    both kinds per listener, and a client with the right password from another address
    connects at once meanwhile."""
    limit = bound()
    seconds = 3.0
    before = {
        (name, listener): _metric(served, name, listener)
        for name in ("sparkiq_auth_failures_total", "sparkiq_auth_throttled_total")
        for listener in ("pg", "http")
    }
    pg: dict[str, int] = {}
    http: dict[str, int] = {}
    attackers = [
        threading.Thread(target=lambda: pg.update(_hammer_pg(served, "127.0.0.3", seconds))),
        threading.Thread(target=lambda: http.update(_hammer_http(served, "127.0.0.4", seconds))),
    ]
    with Prober(served) as prober:
        for thread in attackers:
            thread.start()
        time.sleep(seconds / 2)  # mid-burst: a right password from elsewhere gets in at once
        started = time.monotonic()
        with psycopg.connect(_dsn(served), autocommit=True) as conn:
            assert conn.execute(PROBE).fetchall() == [(17,)]
        took = time.monotonic() - started
        for thread in attackers:
            thread.join(60)
    # 4 guesses at once (the 4th starts the bars), then after bars of 0.25, 0.5 and 1 s one
    # each: at most 7 checked in 3 s however fast the attacker goes; the rest are refused
    # unchecked (the old code checked every one: 1,066 a second)
    assert set(pg) <= {"28P01", "28000"}, pg
    assert 3 <= pg["28P01"] <= 7 and pg.get("28000", 0) >= 1, pg
    assert 3 <= http["checked"] <= 7 and http.get("throttled", 0) >= 1, http
    assert took < limit, f"the right password took {took:.2f} s"
    grown = {k: _metric(served, *k) - v for k, v in before.items()}
    assert grown == {
        ("sparkiq_auth_failures_total", "pg"): pg["28P01"],
        ("sparkiq_auth_failures_total", "http"): http["checked"],
        ("sparkiq_auth_throttled_total", "pg"): pg["28000"],
        ("sparkiq_auth_throttled_total", "http"): http["throttled"],
    }
    prober.check(limit)


def test_wrong_passwords_sent_at_once_are_checked_no_faster(served: Served) -> None:
    """24 logins with wrong passwords from one address at the same moment: a login's
    password is judged only after round trips, so admission reserves the attempt; the free
    failures and one more are checked, the rest refused unchecked, however many arrive."""
    host, port = served.pg_address
    start = threading.Barrier(24)
    codes: list[str] = []

    def guess() -> None:
        start.wait(30)
        try:
            pg8000.native.Connection(
                "tester", host=host, port=port, password="guess", source_address=(CROWD, 0)
            )
            codes.append("logged in")
        except pg8000.exceptions.DatabaseError as exc:
            codes.append(exc.args[0]["C"])

    threads = [threading.Thread(target=guess) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(codes) == 24 and set(codes) <= {"28P01", "28000"}, codes
    # 3 free + the one that starts the bars; on a slow machine a bar or two may pass while
    # the 24 connect, letting one more through each
    assert 4 <= codes.count("28P01") <= 7, codes


# -- 4. SCRAM ----------------------------------------------------------------------------------


def _psql(node: Served, password: str) -> subprocess.CompletedProcess[str]:
    host, port = node.pg_address
    env = dict(os.environ, PGPASSWORD=password, PGCONNECT_TIMEOUT="20")
    return subprocess.run(
        ["psql", "-h", host, "-p", str(port), "-U", "tester", "-d", "sparkiq", "-Atc", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _asyncpg_probe(node: Served, password: str) -> Any:
    async def run() -> Any:
        conn = await asyncpg.connect(
            host=node.pg_address[0],
            port=node.pg_address[1],
            user="tester",
            password=password,
            database="sparkiq",
        )
        try:
            return await conn.fetchval(PROBE)
        finally:
            await conn.close()

    return asyncio.run(run())


def _cleartext_login(node: Served) -> list[Any]:
    """What the server answers a client that sends the token in clear text (a
    PasswordMessage) instead of following the exchange it asked for."""
    with socket.create_connection(node.pg_address, timeout=10) as sock:
        sock.sendall(_startup_bytes("tester"))
        answers: list[Any] = []
        password = TOKEN.encode() + b"\0"
        sock.sendall(b"p" + struct.pack("!i", len(password) + 4) + password)
        client = FrontendConnection()
        client.send(m.StartupMessage(params={"user": "tester"}))  # its state, for decoding
        while data := sock.recv(65536):
            answers.extend(client.receive(data))
        return answers


GUESSER = "127.0.0.6"


@pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql")
def test_logins_prove_the_token_with_scram_and_never_send_it(served: Served) -> None:
    """The password was the token in clear text. The endpoint now asks for SCRAM-SHA-256
    only: psycopg refusing any other exchange (libpq's require_auth), psql, pg8000 and
    asyncpg log in with the right token and are refused (28P01, counted) with a wrong one;
    the token sent in clear text is refused; wrong SCRAM proofs from one address are
    throttled like any wrong password."""
    limit = bound()
    scram_only = " require_auth=scram-sha-256"
    failures = _metric(served, "sparkiq_auth_failures_total", "pg")
    host, port = served.pg_address
    with Prober(served) as prober:
        with psycopg.connect(_dsn(served) + scram_only, autocommit=True) as conn:
            assert conn.execute(PROBE).fetchall() == [(17,)]
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(_dsn(served, "wrong") + scram_only)

        assert _psql(served, TOKEN).stdout.strip() == "17"
        wrong = _psql(served, "wrong")
        assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr

        conn8000 = pg8000.native.Connection("tester", host=host, port=port, password=TOKEN)
        assert conn8000.run(PROBE) == [[17]]
        conn8000.close()
        with pytest.raises(pg8000.exceptions.DatabaseError) as refused:
            pg8000.native.Connection("tester", host=host, port=port, password="wrong")
        assert refused.value.args[0]["C"] == "28P01"

        assert _asyncpg_probe(served, TOKEN) == 17
        with pytest.raises(asyncpg.InvalidPasswordError):
            _asyncpg_probe(served, "wrong")

        answers = _cleartext_login(served)
        # offered SCRAM only; the clear-text password ends the login with an error
        assert [type(a) for a in answers] == [m.AuthenticationSASL, m.ErrorResponse], answers
        assert answers[0].mechanisms == ["SCRAM-SHA-256"]
        assert dict(answers[1].fields)["C"] == "08P01"

        codes: list[str] = []
        # Wrong proofs from one address: the first 4 are checked, then the bars start (0.25 s,
        # 0.5 s...: however slow the machine, an attempt soon lands inside one).
        while "28000" not in codes and len(codes) < 30:
            try:
                pg8000.native.Connection(
                    "tester", host=host, port=port, password="guess", source_address=(GUESSER, 0)
                )
            except pg8000.exceptions.DatabaseError as exc:
                codes.append(exc.args[0]["C"])
    assert codes[:4] == ["28P01"] * 4 and codes[-1] == "28000", codes
    grown = _metric(served, "sparkiq_auth_failures_total", "pg") - failures
    assert grown == 4 + codes.count("28P01")  # one per client's wrong password, and the guesses
    prober.check(limit)


def test_scram_follows_the_rfc_7677_example_and_refuses_malformed_messages() -> None:
    """RFC 7677's SCRAM-SHA-256 example, byte for byte, from the server's side; a wrong
    proof is a wrong password (None), a malformed message an error."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    verifier = ScramVerifier.from_password("pencil", salt=salt)
    server_nonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    nonce = "rOprNGfwEbeRWgbNEkqO" + server_nonce
    exchange = ScramExchange(verifier, nonce=server_nonce)
    assert exchange.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        f"r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    )
    proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    final = f"c=biws,r={nonce},p={proof}".encode()
    assert exchange.final(final) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    wrong = ScramExchange(ScramVerifier.from_password("pencils", salt=salt), nonce=server_nonce)
    wrong.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert wrong.final(final) is None
    for first, reason in [
        (b"p=tls-server-end-point,,n=,r=abc", "channel binding is not offered"),
        (b"n,a=admin,n=,r=abc", "starts with n,, or y,,"),
        (b"n,,r=abc", "names a user"),
        (b"\xff", "UTF-8"),
    ]:
        with pytest.raises(ScramError, match=reason):
            ScramExchange(verifier).first(first)
    replayed = ScramExchange(verifier, nonce="other")
    replayed.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramError, match="nonce"):
        replayed.final(final)  # a proof for another exchange's nonce


# -- 5. catalog queries ------------------------------------------------------------------------

# A catalog query that runs for seconds: pg_attribute (one row per served column, 25 here)
# joined with itself seven times.
SLOW_CATALOG = (
    "SELECT count(*) FROM "
    + ", ".join(f"pg_catalog.pg_attribute a{i}" for i in range(7))
    + " WHERE a0.attname || a1.attname || a2.attname <> a6.attname"
)
SLOW_USER = "SELECT count(*) FROM t a, t b, t c, t d WHERE a.k || b.k || c.k <> d.k"
QUICK_CATALOG = "SELECT relname FROM pg_catalog.pg_class WHERE relname = 'ik'"


def _catalog_while(node: Node, slow: str) -> tuple[int, float]:
    """Run ``slow`` on one connection and :data:`QUICK_CATALOG` over and over on another
    until it ends: how many quick answers came while ``slow`` ran, and the slowest."""
    ended = threading.Event()

    def run_slow() -> None:
        try:
            with (
                psycopg.connect(_dsn(node), autocommit=True) as conn,
                contextlib.suppress(psycopg.errors.QueryCanceled),  # on a very slow machine
            ):
                conn.execute(slow).fetchall()
        finally:
            ended.set()

    slow_thread = threading.Thread(target=run_slow, daemon=True)
    answered, worst = 0, 0.0
    with psycopg.connect(_dsn(node), autocommit=True) as conn:
        slow_thread.start()
        while not ended.is_set():
            started = time.monotonic()
            assert conn.execute(QUICK_CATALOG).fetchall() == [("ik",)]
            worst = max(worst, time.monotonic() - started)
            answered += 0 if ended.is_set() else 1
            time.sleep(0.02)
    slow_thread.join(60)
    return answered, worst


def test_catalog_queries_never_wait_behind_another_connections_statement(node: Node) -> None:
    """Catalog queries (psql's \\d, a driver's type lookups at connect) shared one locked
    DuckDB connection: behind another connection's seconds-long catalog query every one of
    them waited (3.2 s measured). Now each query has a cursor of its own; and they never
    waited behind user statements (which do not use the catalog), as the second half
    shows."""
    limit = bound()
    with Prober(node) as prober:
        behind_catalog, worst_catalog = _catalog_while(node, SLOW_CATALOG)
        behind_user, worst_user = _catalog_while(node, SLOW_USER)
    assert behind_catalog >= 3 and worst_catalog < limit, (behind_catalog, worst_catalog)
    assert behind_user >= 3 and worst_user < limit, (behind_user, worst_user)
    prober.check(limit)
