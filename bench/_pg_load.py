"""A Postgres-protocol load generator for :mod:`bench.pgwire`, run as its own process.

``python -m bench._pg_load SPEC.json``: ``connections`` psycopg connections to ``dsn``, all
opened before the clock starts, each asking ``query`` with one random key of ``keys`` as a
prepared statement (extended protocol, ``$1`` bound server-side), the next as soon as the
answer is read (closed loop), for ``duration`` seconds. Writes ``requests``, ``errors``,
``seconds``, ``cpu_seconds`` (this process's own) and ``latencies_us`` as JSON to ``out``, as
:mod:`bench._http_load` does for HTTP, on the same event loop (uvloop when installed).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import psycopg


async def _closed(spec: dict[str, Any]) -> dict[str, Any]:
    keys: list[str] = spec["keys"]
    query: str = spec["query"]
    connections = [
        await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True)
        for _ in range(spec["connections"])
    ]
    latencies: list[float] = []
    counts = {"requests": 0, "errors": 0}
    deadline = time.perf_counter() + spec["duration"]

    async def worker(conn: psycopg.AsyncConnection[Any], seed: int) -> None:
        rng = random.Random(seed)
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                cursor = await conn.execute(query, (rng.choice(keys),), prepare=True)
                found = len(await cursor.fetchall())
            except psycopg.Error:
                found = -1
            latencies.append((time.perf_counter() - t0) * 1e6)
            counts["requests"] += 1
            if found != 1:
                counts["errors"] += 1

    started, cpu = time.perf_counter(), time.process_time()
    try:
        await asyncio.gather(*(worker(c, i) for i, c in enumerate(connections)))
    finally:
        for conn in connections:
            await conn.close()
    return {
        **counts,
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu,
        "latencies_us": latencies[:: max(1, len(latencies) // 20000)],
    }


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = json.dumps(asyncio.run(_closed(spec)))
    with open(spec["out"], "w") as out:
        out.write(result)


if __name__ == "__main__":
    main()
