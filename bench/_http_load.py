"""An HTTP/1.1 load generator on raw asyncio sockets, run as its own process.

Python HTTP clients cost more per request than the servers measured here, so this one does
the minimum: keep-alive connections, requests pre-encoded, responses parsed by
Content-Length (or chunked, read to the terminating chunk). Two modes:

* ``closed`` -- ``connections`` loops, each sending its next request when the previous
  answer arrived, for ``duration`` seconds: the most requests per second the server
  sustains.
* ``open`` -- requests scheduled at a fixed ``rate`` regardless of answers; each latency is
  measured from its *scheduled* time, so a stalled server is not hidden (no coordinated
  omission).

Usage: ``python -m bench._http_load <spec.json>``; writes one JSON object to the spec's ``out``
file: ``requests``,
``errors`` (non-2xx/404 statuses and failures), ``seconds``, ``latencies_us`` (sampled).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any


def _encode(
    host: str, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        end = lower.index(b"\r\n", at)
        await reader.readexactly(int(lower[at + 15 : end]))
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def _closed(spec: dict[str, Any], requests: list[bytes]) -> dict[str, Any]:
    host, port = spec["host"], spec["port"]
    deadline = time.perf_counter() + spec["duration"]
    latencies: list[float] = []
    counts = {"requests": 0, "errors": 0}

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                writer.write(rng.choice(requests))
                status = await _read_response(reader)
                latencies.append((time.perf_counter() - t0) * 1e6)
                counts["requests"] += 1
                if status >= 400 and status != 404:
                    counts["errors"] += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(spec["connections"])))
    elapsed = time.perf_counter() - started
    return {
        **counts,
        "seconds": elapsed,
        "latencies_us": latencies[:: max(1, len(latencies) // 20000)],
    }


async def _open(spec: dict[str, Any], requests: list[bytes]) -> dict[str, Any]:
    host, port, rate = spec["host"], spec["port"], spec["rate"]
    total = int(rate * spec["duration"])
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(spec["connections"]):
        pool.put_nowait(await asyncio.open_connection(host, port))
    latencies: list[float] = []
    counts = {"requests": 0, "errors": 0}
    rng = random.Random(1)

    async def one(scheduled: float, request: bytes) -> None:
        reader, writer = await pool.get()
        try:
            writer.write(request)
            status = await _read_response(reader)
        finally:
            pool.put_nowait((reader, writer))
        latencies.append((time.perf_counter() - scheduled) * 1e6)
        counts["requests"] += 1
        if status >= 400 and status != 404:
            counts["errors"] += 1

    started = time.perf_counter()
    tasks = []
    for i in range(total):
        scheduled = started + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(scheduled, rng.choice(requests))))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    while not pool.empty():
        pool.get_nowait()[1].close()
    return {**counts, "seconds": elapsed, "latencies_us": latencies}


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    headers = {"Connection": "keep-alive", **spec.get("headers", {})}
    host = f"{spec['host']}:{spec['port']}"
    requests = [
        _encode(
            host,
            r.get("method", "GET"),
            r["path"],
            r.get("body", "").encode() or None,
            headers | r.get("headers", {}),
        )
        for r in spec["requests"]
    ]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    run = _closed if spec["mode"] == "closed" else _open
    result = json.dumps(asyncio.run(run(spec, requests)))
    # To a file, not stdout: the event loop may leave stdout non-blocking, and a result of a
    # few hundred KB written to a full pipe was cut at 128 KiB.
    with open(spec["out"], "w") as out:
        out.write(result)


if __name__ == "__main__":
    main()
