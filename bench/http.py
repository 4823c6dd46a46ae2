"""HTTP key lookups: one node's throughput and tail latency, and the cost of a remote hop.

A table of 100k keys in 8 partitions is written by hand (no Spark). Servers run as their
own processes, the load generator (:mod:`bench._http_load`, raw asyncio sockets) as another,
all on this machine's two cores:

* floor -- :mod:`bench._asgi_floor`: uvicorn calling a bare ASGI function that reads the
  encoded key from one RocksDB and returns the stored bytes;
* node -- ``sparkiq serve`` answering ``GET /stores/{store}/keys/{key}`` (key validation,
  partitioning, replica read, row decoding, JSON with the position token).

Each is measured closed-loop (32 connections as fast as answers come: requests per second,
and the server process's CPU time per request, read from ``/proc``: on a shared machine the
throughput moves with what else runs, the CPU a request costs much less) and open-loop at
1,000 requests per second (latency from each request's scheduled time).
Then two nodes without standbys split the partitions, and one of them is asked, one request
at a time, for keys it hosts (answered locally) and keys the other hosts (forwarded over the
node protocol): the difference of the medians is the remote hop.

Run: ``python -m bench.http [--quick | --smoke]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench import _common
from bench._common import (
    Report,
    Scale,
    entry_point,
    median,
    percentile,
    polling_client,
    scratch_dir,
    verdict,
)
from bench._flames import enabled as flames_enabled
from bench._flames import flame
from bench.lookup import _build, _floor_db

TABLE = "lookup"
THROUGHPUT_TARGET = 5000.0
P99_TARGET_MS = 10.0
OPEN_RATE = 1000
SQL_THROUGHPUT_TARGET = 3000.0
SQL_P99_TARGET_MS = 15.0
SQL_OPEN_RATE = 500
#: Where ``python -m bench._http_load`` and ``bench._asgi_floor`` import from, whatever the
#: caller's working directory.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOOR_NAME = "floor: bare ASGI + rocksdict"
NODE_NAME = "node: GET /stores/{store}/keys/{key}"
SQL_NAME = "node: SQL `... WHERE k = '...'` (POST /query)"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(url: str, path: str = "/healthz", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if polling_client().get(url + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url}{path} did not answer")


def _serve(
    state_dir: str,
    node_id: str,
    port: int,
    peers: str = "",
    standbys: int = 1,
    extra: Sequence[str] = (),
) -> Any:
    return _common.start_python(
        [
            sys.executable, "-m", "sparkiq.cli", "serve", "--state-dir", state_dir,
            "--node-id", node_id, "--listen", f"127.0.0.1:{port}", "--peers", peers,
            "--standbys", str(standbys), *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def load(
    port: int, paths: Sequence[str | dict[str, Any]], mode: str, duration: float, **extra: Any
) -> dict[str, Any]:
    spec = {
        "host": "127.0.0.1",
        "port": port,
        "mode": mode,
        "duration": duration,
        "connections": extra.pop("connections", 32),
        "requests": [p if isinstance(p, dict) else {"path": p} for p in paths],
        **extra,
    }
    return run_generator("bench._http_load", spec)


def run_generator(module: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run the load generator ``python -m module`` as its own process with ``spec`` (a JSON
    file it reads) and return the JSON result it writes to ``spec["out"]``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        spec = {**spec, "out": handle.name + ".out"}
        json.dump(spec, handle)
    try:
        done = subprocess.run(
            [sys.executable, "-m", module, handle.name],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if done.returncode:
            raise RuntimeError(f"the load generator {module} failed: {done.stderr[-2000:]}")
        with open(spec["out"]) as answer:
            result: dict[str, Any] = json.load(answer)
    finally:
        for path in (handle.name, spec["out"]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return result


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds process ``pid`` has used (None where ``/proc`` is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(*processes: Any) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def run(scale: Scale = Scale.FULL) -> Report:
    n_keys = scale.pick(100_000, 20_000, 1_000)
    duration = scale.pick(5.0, 2.0, 0.2)
    warm_up = scale.pick(1.0, 1.0, 0.0)  # seconds; a smoke run's figures need none
    rounds = scale.pick(2, 1, 1)
    report = Report(
        name="http",
        title="HTTP key lookup: one node, and a remote hop",
        measures=(
            f"`GET /stores/{{store}}/keys/{{key}}` on random existing keys of a {n_keys:,}-key, "
            "8-partition table; closed loop with 32 keep-alive connections (throughput), open "
            f"loop at {OPEN_RATE:,} req/s (latency from the scheduled send time); servers and "
            "load generator are separate processes on the same two cores"
        ),
        baseline="floor: uvicorn + a bare ASGI function reading the same RocksDB bytes",
        target=f"lookups >= {THROUGHPUT_TARGET:,.0f} req/s, p99 <= {P99_TARGET_MS:.0f} ms at "
        f"{OPEN_RATE:,} req/s; SQL lookups >= {SQL_THROUGHPUT_TARGET:,.0f} queries/s, p99 <= "
        f"{SQL_P99_TARGET_MS:.0f} ms at {SQL_OPEN_RATE} queries/s",
        columns=[
            "server",
            "closed-loop req/s",
            "server CPU us/req",
            "open-loop rate",
            "p50 ms",
            "p99 ms",
            "errors",
        ],
        scale=scale,
    )
    with scratch_dir("http") as root:
        state_dir = os.path.join(root, "state")
        table, keys = _build(state_dir, n_keys, 8)
        floor = _floor_db(os.path.join(root, "floor"), table)
        floor.close()
        paths = [f"/stores/{TABLE}/keys/{k}" for k in keys[:: max(1, n_keys // 20_000)]]
        floor_port, node_port = _free_port(), _free_port()
        floor_proc = _common.start_python(
            [
                sys.executable,
                "-m",
                "bench._asgi_floor",
                os.path.join(root, "floor"),
                str(floor_port),
            ],
            cwd=ROOT,
        )
        node_proc = _serve(state_dir, "bench", node_port, standbys=0)
        results: dict[str, dict[str, list[float]]] = {}
        try:
            _wait(f"http://127.0.0.1:{floor_port}", f"/x/{keys[0]}")
            _wait(f"http://127.0.0.1:{node_port}", "/readyz")
            sql = [
                {
                    "method": "POST",
                    "path": "/query",
                    "body": json.dumps({"sql": f"SELECT * FROM {TABLE} WHERE k = '{k}'"}),
                    "headers": {"Content-Type": "application/json"},
                }
                for k in keys[:: max(1, n_keys // 20_000)]
            ]
            servers: dict[str, tuple[int, Sequence[Any], int, int]] = {
                FLOOR_NAME: (floor_port, paths, OPEN_RATE, floor_proc.pid),
                NODE_NAME: (node_port, paths, OPEN_RATE, node_proc.pid),
                SQL_NAME: (node_port, sql, SQL_OPEN_RATE, node_proc.pid),
            }
            for port, requests, _, _ in servers.values() if warm_up else ():
                load(port, requests, "closed", warm_up)
            if flames_enabled():  # a pass of its own, the figures' runs left unsampled
                with flame("http-get", pid=node_proc.pid):
                    load(node_port, paths, "closed", 4.0)
                with flame("http-sql", pid=node_proc.pid):
                    load(node_port, sql, "closed", 4.0)
            for _ in range(rounds):
                for name, (port, requests, rate, pid) in servers.items():
                    before = cpu_seconds(pid)
                    closed = load(port, requests, "closed", duration)
                    after = cpu_seconds(pid)
                    opened = load(port, requests, "open", duration, rate=rate)
                    entry = results.setdefault(
                        name, {"rps": [], "cpu_us": [], "p50": [], "p99": [], "errors": []}
                    )
                    entry["rps"].append(closed["requests"] / closed["seconds"])
                    if before is not None and after is not None and closed["requests"]:
                        entry["cpu_us"].append((after - before) / closed["requests"] * 1e6)
                    entry["p50"].append(percentile(opened["latencies_us"], 50) / 1000)
                    entry["p99"].append(percentile(opened["latencies_us"], 99) / 1000)
                    entry["errors"].append(closed["errors"] + opened["errors"])
        finally:
            _stop(floor_proc, node_proc)
        for name, entry in results.items():
            report.rows.append(
                [
                    name,
                    f"{median(entry['rps']):,.0f}",
                    f"{median(entry['cpu_us']):.1f}" if entry["cpu_us"] else "-",
                    f"{servers[name][2]:,}/s",
                    f"{median(entry['p50']):.2f}",
                    f"{median(entry['p99']):.2f}",
                    f"{int(sum(entry['errors']))}",
                ]
            )
        node, sql_entry, floor_entry = results[NODE_NAME], results[SQL_NAME], results[FLOOR_NAME]
        rps, p99 = median(node["rps"]), median(node["p99"])
        report.readings.append(
            f"node: {rps:,.0f} req/s = {rps / median(floor_entry['rps']):.2f}x the floor; "
            + verdict(rps, THROUGHPUT_TARGET, "req/s", at_most=False)
        )
        if node["cpu_us"] and floor_entry["cpu_us"]:
            node_cpu, floor_cpu = median(node["cpu_us"]), median(floor_entry["cpu_us"])
            report.readings.append(
                f"server CPU a lookup: node {node_cpu:.1f} us, floor {floor_cpu:.1f} us "
                f"(the floor's work is {floor_cpu / node_cpu:.2f}x the node's)"
            )
            report.figures.update({"node_cpu_us": node_cpu, "floor_cpu_us": floor_cpu})
        report.readings.append(
            f"node p99 at {OPEN_RATE:,} req/s: {p99:.2f} ms; "
            + verdict(p99, P99_TARGET_MS, "ms", at_most=True)
        )
        sql_rps, sql_p99 = median(sql_entry["rps"]), median(sql_entry["p99"])
        report.readings.append(
            f"SQL key lookup: {sql_rps:,.0f} queries/s, "
            + verdict(sql_rps, SQL_THROUGHPUT_TARGET, "queries/s", at_most=False)
            + f"; p99 at {SQL_OPEN_RATE} queries/s {sql_p99:.2f} ms, "
            + verdict(sql_p99, SQL_P99_TARGET_MS, "ms", at_most=True)
        )
        report.readings.append(
            f"SQL key lookup over REST: {sql_rps:,.0f} queries/s = {sql_rps / rps:.2f}x the "
            f"REST GET of the same keys ({rps:,.0f} req/s)"
        )
        report.figures.update(
            {
                "node_rps": rps,
                "node_p99_ms": p99,
                "floor_rps": median(floor_entry["rps"]),
                "sql_rps": sql_rps,
                "sql_p99_ms": sql_p99,
            }
        )
        report.readings.append(_remote_hop(state_dir, table, keys, scale))
    return report


def _remote_hop(state_dir: str, table: Any, keys: list[str], scale: Scale) -> str:
    """p50 of lookups answered by the asked node vs forwarded to the other node."""
    ports = [_free_port(), _free_port()]
    a = _serve(state_dir, "hop-a", ports[0], standbys=0)
    b = _serve(state_dir, "hop-b", ports[1], peers=f"127.0.0.1:{ports[0]}", standbys=0)
    try:
        url = f"http://127.0.0.1:{ports[0]}"
        _wait(url, "/readyz")
        _wait(f"http://127.0.0.1:{ports[1]}", "/readyz")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            nodes = polling_client().get(f"{url}/metadata").json()["nodes"]
            if len(nodes) == 2 and all(
                polling_client().get(f"{n['url']}/readyz").status_code == 200 for n in nodes
            ):
                break
            time.sleep(0.2)
        time.sleep(1.5)  # old owners release what moved
        mine = next(n for n in nodes if n["node_id"] == "hop-a")["active"][TABLE]
        local = [k for k in keys[:5000] if table.partition_of(k) in mine]
        remote = [k for k in keys[:5000] if table.partition_of(k) not in mine]
        seconds = scale.pick(4.0, 2.0, 0.2)
        timings = {}
        for name, subset in (("local", local), ("remote", remote)):
            paths = [f"/stores/{TABLE}/keys/{k}" for k in subset]
            if warm_up := scale.pick(1.0, 1.0, 0.0):
                load(ports[0], paths, "closed", warm_up, connections=1)
            result = load(ports[0], paths, "closed", seconds, connections=1)
            assert result["errors"] == 0
            timings[name] = median(result["latencies_us"]) / 1000
    finally:
        _stop(a, b)
    hop = timings["remote"] - timings["local"]
    return (
        f"remote hop: p50 {timings['local']:.2f} ms answered locally vs {timings['remote']:.2f} ms "
        f"forwarded to the other node (+{hop:.2f} ms), one request at a time"
    )


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
