"""A 100k-row SQL result through Flight SQL (ADBC) vs the Postgres endpoint vs REST Arrow.

The table of :mod:`bench.arrow` (100k rows of a string key, a long, a double, a
``decimal(12,2)``, a ``timestamp`` and a short string, 8 partitions, RocksDB) is served by
one :class:`~sparkiq.Node` with ``listen``, ``pg_listen`` and ``flight_listen`` on
127.0.0.1. ``SELECT * FROM wide`` is fetched until the caller holds the data by:

* the floor: ``node.sql`` in the node's own process;
* Flight SQL: ADBC's Flight SQL driver, ``cursor.fetch_arrow_table()`` (a pyarrow table);
* Postgres: psycopg 3, ``cursor.fetchall()`` (Python tuples, the text format);
* REST Arrow: ``Client.sql(..., format="arrow").to_arrow()``.

Methods take turns, so drift on the shared machine hits every method alike; each call is
timed on its own and reported as a median. The bytes each method moves are counted once,
outside the timings, through a counting TCP relay in front of the endpoint (both
directions; TLS off). Client and node share one process and the two cores.

Run: ``python -m bench.flight [--quick | --smoke]``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import psycopg

from bench._common import Report, Scale, entry_point, median, scratch_dir, timed_in_turns
from bench.arrow import SQL, _build
from sparkiq import Client, Node

FLOOR = "floor: node.sql in-process"
FLIGHT = "Flight SQL: ADBC fetch_arrow_table()"
POSTGRES = "Postgres: psycopg fetchall()"
REST = 'REST Arrow: Client.sql(..., format="arrow").to_arrow()'


class _Relay:
    """Forwards one listening port to ``target``, counting the bytes both ways."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.bytes = 0
        self._lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                with self._lock:
                    self.bytes += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def run(scale: Scale = Scale.FULL) -> Report:
    rows, rounds = scale.pick((100_000, 7), (20_000, 3), (500, 1))
    sizes: dict[str, int] = {}
    with scratch_dir("flight") as state_dir:
        _build(state_dir, rows)
        node = Node(
            state_dir, listen="127.0.0.1:0", pg_listen="127.0.0.1:0", flight_listen="127.0.0.1:0"
        )
        node.start()
        try:
            node.poll_once()
            assert node.url and node.pg_address and node.flight_address
            client = Client(node.url)

            def flight_at(address: tuple[str, int]) -> Callable[[], int]:
                conn = flightsql.connect("grpc://{}:{}".format(*address), autocommit=True)

                def fetch() -> int:
                    with conn.cursor() as cur:
                        cur.execute(SQL)
                        count: int = cur.fetch_arrow_table().num_rows
                        return count

                return fetch

            def postgres_at(address: tuple[str, int]) -> Callable[[], int]:
                conn = psycopg.connect(
                    "host={} port={} user=bench dbname=sparkiq".format(*address), autocommit=True
                )
                return lambda: len(conn.execute(SQL).fetchall())

            def rest() -> int:
                count: int = client.sql(SQL, format="arrow").to_arrow().num_rows
                return count

            methods: dict[str, Callable[[], int]] = {
                FLOOR: lambda: len(node.sql(SQL).rows),
                FLIGHT: flight_at(node.flight_address),
                POSTGRES: postgres_at(node.pg_address),
                REST: rest,
            }
            # bytes on the wire, once per method, through a counting relay (not timed)
            for name, at in ((FLIGHT, flight_at), (POSTGRES, postgres_at)):
                address = node.flight_address if name == FLIGHT else node.pg_address
                relay = _Relay(address)
                fetch = at(("127.0.0.1", relay.port))
                before = relay.bytes
                assert fetch() == rows
                time.sleep(0.2)  # the relay's threads count the last bytes
                sizes[name] = relay.bytes - before
                relay.close()
            host, port = node.url.split("//", 1)[1].rsplit(":", 1)
            rest_relay = _Relay((host, int(port)))
            relayed = Client(f"http://127.0.0.1:{rest_relay.port}")
            before = rest_relay.bytes
            assert relayed.sql(SQL, format="arrow").to_arrow().num_rows == rows
            time.sleep(0.2)
            sizes[REST] = rest_relay.bytes - before
            relayed.close()
            rest_relay.close()
            times = timed_in_turns(methods, rounds, rows)
            client.close()
        finally:
            node.stop()
    report = Report(
        name="flight",
        title="Flight SQL vs Postgres vs REST Arrow: a 100k-row result",
        measures=f"`{SQL}` ({rows:,} rows of 6 columns: string key, long, double, "
        "decimal(12,2), timestamp, string; 8 partitions, RocksDB), from the request until "
        f"the caller holds the data; {rounds} calls per method after one warm-up, methods "
        "taking turns; client and node in one process; bytes both ways through a relay",
        baseline="floor: `node.sql` of the same statement in the node's process",
        target="none (a comparison)",
        columns=["method", "median ms", "vs floor", "MB on the wire"],
        scale=scale,
    )
    medians = {name: median(values) for name, values in times.items()}
    base = medians[FLOOR]
    for name, value in medians.items():
        wire = f"{sizes[name] / 1e6:,.2f}" if name in sizes else "-"
        report.rows.append([name, f"{value * 1e3:,.0f}", f"{value / base:.2f}x", wire])
    report.readings.append(
        f"{rows:,} rows: Flight SQL {medians[FLIGHT] * 1e3:,.0f} ms "
        f"({sizes[FLIGHT] / 1e6:,.1f} MB), Postgres {medians[POSTGRES] * 1e3:,.0f} ms "
        f"({sizes[POSTGRES] / 1e6:,.1f} MB), REST Arrow {medians[REST] * 1e3:,.0f} ms "
        f"({sizes[REST] / 1e6:,.1f} MB), of which node.sql {base * 1e3:,.0f} ms"
    )
    return report


main: Callable[..., dict[str, Any]] = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
