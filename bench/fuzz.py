"""Fuzzing a node for longer than the tests do: SQL statements from the grammar of
``tests.fuzz.sqlgen`` (several seeds) and schemathesis over every operation of
``/openapi.json``, while a client looks a key up on another connection.

One ``sparkiq serve`` process serves the tables of ``tests.sql.tables.build_world`` with a
token. The lookup client runs alone first (the floor), then throughout the fuzzing; the
report gives both latency distributions, and the fuzzing's verdicts: answers by status
(no 5xx allowed), generated statements compared with DuckDB over the ground truth, and
errors that would leak a path or a class name.

Run: ``python -m bench.fuzz [--quick | --smoke]``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import duckdb
import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench import _common
from bench._common import (
    Report,
    Scale,
    entry_point,
    median,
    percentile,
    polling_client,
    scratch_dir,
)

TOKEN = "bench-fuzz"
PROBE = "/stores/ik/keys/1"


class _Lookups(threading.Thread):
    """Key lookups one after another on a kept-alive connection until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        headers = {"authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            while not self.stop_event.is_set():
                started = time.perf_counter()
                response = client.get(PROBE)
                self.latencies.append(time.perf_counter() - started)
                if response.status_code != 200 or response.json()["row"] != {"key": 1, "v": 17}:
                    self.failures += 1
                time.sleep(0.002)

    def stop(self) -> None:
        """Stop once the lookup under way is done, and not before a first one was timed: a
        smoke run's phase (0.3 s of floor) can end before a loaded machine answered any,
        and a phase without a latency has no percentile."""
        deadline = time.monotonic() + 120
        while not self.latencies and self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.stop_event.set()
        self.join()


def _openapi(url: str, examples: int) -> tuple[int, dict[int, int], list[str]]:
    import schemathesis
    from schemathesis.generation import GenerationMode
    from tests.fuzz.harness import FuzzReport, judge_error

    from sparkiq.server.openapi import openapi_document

    report = FuzzReport()
    headers = {"authorization": f"Bearer {TOKEN}"}
    for result in schemathesis.openapi.from_dict(openapi_document()).get_all_operations():
        operation = result.ok()
        strategy = st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        )

        @settings(
            max_examples=examples,
            derandomize=True,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def one(case: Any) -> None:
            response = case.call(base_url=url, headers=headers, timeout=60)
            report.cases += 1
            report.statuses[response.status_code] += 1
            if response.status_code >= 400:
                what = f"{case.method} {case.formatted_path} {str(case.body)[:200]}"
                judge_error(
                    report, what, httpx.Response(response.status_code, content=response.content)
                )

        one()
    return report.cases, dict(report.statuses), report.problems


def run(scale: Scale = Scale.FULL) -> Report:
    from tests.fuzz.harness import sql_fuzz
    from tests.sql.tables import build_world, truth_tables

    seeds = scale.pick([1, 2, 3, 4, 5, 6, 7, 8], [1, 2], [1])
    per_seed, examples, floor_seconds = scale.pick((500, 150, 10.0), (250, 25, 3.0), (20, 1, 0.3))
    report = Report(
        name="fuzz",
        title="Fuzzing: generated SQL and OpenAPI requests against one node",
        measures="answers by status, differences from DuckDB, leaks; lookup latency meanwhile",
        baseline="lookups on the same node with nothing else running",
        target="no 5xx, no wrong answer, no leak; lookups p99 within 2x the floor",
        columns=[
            "phase",
            "cases",
            "2xx",
            "4xx",
            "5xx",
            "compared",
            "problems",
            "lookup p50",
            "lookup p99",
            "p99 / floor",
        ],
        scale=scale,
    )
    with scratch_dir("fuzz") as state_dir:
        truth = build_world(state_dir)
        ground = duckdb.connect(":memory:")
        for name, table in truth_tables(truth).items():
            ground.register(name, table)
        node = _Served(state_dir)
        try:
            floor = _Lookups(node.url)
            floor.start()
            time.sleep(floor_seconds)
            floor.stop()
            floor_p99 = percentile(floor.latencies, 99)
            report.rows.append(
                [
                    "floor (lookups alone)",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    str(floor.failures),
                    _ms(median(floor.latencies)),
                    _ms(floor_p99),
                    "1.0x",
                ]
            )
            problems: list[str] = []
            lookups = _Lookups(node.url)
            lookups.start()
            cases = compared = 0
            statuses: dict[int, int] = {}
            for seed in seeds:
                found = sql_fuzz(
                    node.url, TOKEN, ground, seed=seed, cases=per_seed, budget_seconds=600
                )
                cases += found.cases
                compared += found.compared
                for status, count in found.statuses.items():
                    statuses[status] = statuses.get(status, 0) + count
                problems += found.problems
            lookups.stop()
            report.rows.append(
                _row(
                    "SQL grammar + mutations",
                    cases,
                    statuses,
                    str(compared),
                    problems,
                    lookups,
                    floor_p99,
                )
            )
            lookups = _Lookups(node.url)
            lookups.start()
            api_cases, api_statuses, api_problems = _openapi(node.url, examples)
            lookups.stop()
            report.rows.append(
                _row(
                    "OpenAPI (schemathesis)",
                    api_cases,
                    api_statuses,
                    "-",
                    api_problems,
                    lookups,
                    floor_p99,
                )
            )
            problems += api_problems
        finally:
            node.stop()
            ground.close()
    report.readings.append(
        f"{len(problems)} problems found"
        + ("" if not problems else ": " + "; ".join(p[:200] for p in problems[:5]))
    )
    report.figures["problems"] = problems
    return report


class _Served:
    """``sparkiq serve`` in its own process, so the fuzzing client and the node do not
    share a GIL (the lookup latency is then the node's)."""

    def __init__(self, state_dir: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        args = [
            sys.executable,
            "-m",
            "sparkiq.cli",
            "serve",
            "--state-dir",
            state_dir,
            "--node-id",
            "n0",
            "--listen",
            f"127.0.0.1:{port}",
            "--token",
            TOKEN,
        ]
        self.log = open(os.path.join(state_dir, "node.log"), "wb")  # noqa: SIM115
        self.process = _common.start_python(args, stdout=self.log, stderr=subprocess.STDOUT)
        headers = {"authorization": f"Bearer {TOKEN}"}
        deadline = time.monotonic() + 120
        while True:  # up, and hosting every partition (a lone node takes them all)
            assert self.process.poll() is None, "the node exited; see node.log"
            try:
                answers = [
                    polling_client()
                    .post(
                        f"{self.url}/query",
                        json={"sql": f"SELECT count(*) FROM {t}"},
                        headers=headers,
                        timeout=5,
                    )
                    .status_code
                    for t in ("t", "ik", "lk", "xk", "dk", "ck")
                ]
                if set(answers) == {200}:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the node did not come up"
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _row(
    phase: str,
    cases: int,
    statuses: dict[int, int],
    compared: str,
    problems: list[str],
    lookups: _Lookups,
    floor_p99: float,
) -> list[str]:
    def count(low: int) -> str:
        return str(sum(n for s, n in statuses.items() if low <= s < low + 100))

    p99 = percentile(lookups.latencies, 99)
    return [
        phase,
        str(cases),
        count(200),
        count(400),
        count(500),
        compared,
        str(len(problems) + lookups.failures),
        _ms(median(lookups.latencies)),
        _ms(p99),
        f"{p99 / floor_p99:.1f}x",
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
