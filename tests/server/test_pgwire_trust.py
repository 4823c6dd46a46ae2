"""The Postgres endpoint against hostile clients (issue 25, "Trust"), through real clients.

Each test attacks a node's endpoint on 127.0.0.1 while a prober (a psycopg connection
logged in before the attack) runs a key lookup over and over; besides the attack being
refused, the prober's worst gap between two answers must stay within a second of an idle
core (:func:`tests.server.test_hostile.bound` scales it by the machine's load now). The
attacks come from other loopback addresses (127.0.0.2...) where the endpoint tells peers
apart by address, as an attacker on another host would.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from sparkiq import Node
from tests.server.test_hostile import bound
from tests.sql.tables import build_world

pytestmark = pytest.mark.timeout(180)

TOKEN = "trust-token"
PROBE = "SELECT v FROM ik WHERE key = 1"  # ik holds keys -50, -47, ...: key 1's v is 17
STARTUP_TIMEOUT = 3.0


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


def _dsn(node: Node, password: str = TOKEN) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    return (
        f"host={host} port={port} user=tester dbname=sparkiq password={password} connect_timeout=20"
    )


class Prober:
    """A logged-in psycopg connection running :data:`PROBE` in a thread until stopped;
    records the worst gap between two answers (and the first wrong answer or error)."""

    def __init__(self, node: Node) -> None:
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
    with Prober(node) as prober:
        loris: list[tuple[socket.socket, float]] = []
        for _ in range(64):
            sock = _from("127.0.0.2", node.pg_address)
            sock.sendall(message[:1])
            loris.append((sock, time.monotonic()))
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
