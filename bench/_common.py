"""What every benchmark shares: statistics, result tables, the machine, a SparkSession."""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench import _flames

_T = TypeVar("_T")


class Scale(enum.Enum):
    """How big a run is.

    ``FULL`` gives the figures docs/benchmarks.md records; ``QUICK`` (``--quick``) is
    smaller and less precise. ``SMOKE`` (``--smoke``) is the smallest run that still goes
    through every step of a benchmark (tiny data, one round, seconds): its figures mean
    nothing, and CI runs it (tests/test_bench_smoke.py) so that a benchmark cannot break
    unnoticed."""

    FULL = "full"
    QUICK = "quick"
    SMOKE = "smoke"

    def pick(self, full: _T, quick: _T, smoke: _T) -> _T:
        """The value for this scale."""
        return {Scale.FULL: full, Scale.QUICK: quick, Scale.SMOKE: smoke}[self]


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """``--quick`` and ``--smoke``, which exclude each other, and ``--flames``;
    :func:`scale_of` reads them."""
    parser.add_argument(
        "--flames",
        nargs="?",
        const=str(_flames.FLAMES),
        metavar="DIR",
        help="also draw each measured phase's flame graph, into DIR (default docs/flames/; "
        "py-spy, in a pass of its own: see bench/_flames.py)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="a smaller, faster run")
    group.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest run through every step (seconds; its figures mean nothing)",
    )


def scale_of(args: argparse.Namespace) -> Scale:
    """The run's scale; also turns flame graphs on when ``--flames`` was given."""
    _flames.enable(getattr(args, "flames", None))
    return Scale.SMOKE if args.smoke else Scale.QUICK if args.quick else Scale.FULL


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def timed_in_turns(
    methods: Mapping[str, Callable[[], int]], rounds: int, expected: int
) -> dict[str, list[float]]:
    """Seconds of each call of each method, after one warm-up call each: the methods take
    turns round by round, so the machine's drift hits them alike. Every call must return
    ``expected`` (the rows it read)."""
    for name, fn in methods.items():  # warm plans, connections and caches
        assert fn() == expected, name
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            started = time.perf_counter()
            count = fn()
            times[name].append(time.perf_counter() - started)
            assert count == expected, (name, count)
    return times


def seconds_until(
    check: Callable[[], object], limit: float, since: float | None = None
) -> float | None:
    """Seconds from ``since`` (default: now) until ``check()`` holds, looked at every 0.1 s;
    None when it has not after ``limit``."""
    started = time.monotonic() if since is None else since
    while time.monotonic() - started < limit:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else float("inf")


def fmt_ratio(value: float) -> str:
    return f"{value:,.0f}x" if value >= 100 else f"{value:.1f}x"


def verdict(value: float, target: float, unit: str, *, at_most: bool) -> str:
    """``target (<= 10 us) met`` or ``... missed by 2.3x``: honest and short."""
    met = value <= target if at_most else value >= target
    amount = f"{target:,.0f}{unit}" if unit == "x" else f"{target:,.0f} {unit}"
    head = f"target ({'<=' if at_most else '>='} {amount})"
    if met:
        return f"{head} met"
    factor = value / target if at_most else (target / value if value else float("inf"))
    return f"{head} missed by {factor:.1f}x"


@dataclass
class Report:
    """What one benchmark found, in a shape both the console and the docs can print."""

    name: str
    title: str
    measures: str
    baseline: str
    target: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    readings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)  # printed, not written to the docs
    figures: dict[str, Any] = field(default_factory=dict)
    scale: Scale = Scale.FULL
    #: further result tables, (columns, rows), written after the main one
    more_tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)

    def table(self) -> str:
        """The rows as a Markdown table (also readable on a console)."""
        return markdown_table(self.columns, self.rows)

    def tables(self) -> str:
        """The main table and the further ones, a blank line apart."""
        return "\n\n".join([self.table(), *(markdown_table(c, r) for c, r in self.more_tables)])

    def print(self) -> None:
        size = "" if self.scale is Scale.FULL else f" ({self.scale.value})"
        print(f"\n== {self.title}{size}")
        print(self.tables())
        for line in self.readings:
            print(f"-> {line}")
        for line in [*self.notes, *self.console]:
            print(f"   {line}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "scale": self.scale.value,
            "columns": self.columns,
            "rows": self.rows,
            "readings": self.readings,
            **({"more_tables": self.more_tables} if self.more_tables else {}),
            **self.figures,
        }


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` under ``columns`` as a Markdown table (also readable on a console)."""
    widths = [
        max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(c)
        for i, c in enumerate(columns)
    ]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)) + " |"
        for r in rows
    ]
    return "\n".join(lines)


def cli(run: Callable[[Scale], Report], argv: Sequence[str] | None, doc: str | None) -> Report:
    """Parse ``--quick`` or ``--smoke``, run, print."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    add_scale_arguments(parser)
    args = parser.parse_args(argv)
    report = run(scale_of(args))
    report.print()
    return report


def entry_point(run: Callable[[Scale], Report], doc: str | None) -> Callable[..., dict[str, Any]]:
    """A benchmark module's ``main(argv=None)``: parse ``--quick`` or ``--smoke``, run, print
    the report and return its figures as a dict, as the package docstring promises of every
    module."""

    def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
        return cli(run, argv, doc).as_dict()

    return main


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A temporary directory, removed afterwards (``SPARKIQ_BENCH_TMP`` sets its parent)."""
    path = tempfile.mkdtemp(
        prefix=f"sparkiq-bench-{prefix}-", dir=os.environ.get("SPARKIQ_BENCH_TMP")
    )
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def spark_session() -> Any:
    """The local SparkSession on both cores (created once per process, like the tests')."""
    from sparkiq.errors import ConfigError
    from sparkiq.testing import spark_kafka_jars
    from sparkiq.testing import spark_session as local_session

    # Real-time mode's streaming shuffle flushes every 5 ms, not its default 50 ms
    # (bench.realtime); micro-batch queries do not use it.
    config = {"spark.shuffle.streaming.networkBufferMaxWaitTimeMs": "5"}
    # Spark's Kafka connector for the Kafka benchmarks, when `make jvm-jars` fetched it
    with contextlib.suppress(ConfigError):
        config["spark.jars"] = ",".join(spark_kafka_jars())
    return local_session("sparkiq-bench", config=config)


def machine() -> dict[str, str]:
    """CPU model, cores, RAM and the versions that matter, for the docs."""
    import importlib.metadata as metadata

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "?"
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": ram,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pyspark": version("pyspark"),
        "rocksdict": version("rocksdict"),
        "pyarrow": version("pyarrow"),
        "java": _java_version(),
    }


def _java_version() -> str:
    import subprocess

    java = shutil.which("java")
    if java is None:
        return "not found"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "?"
    lines = (out.stderr or out.stdout).strip().splitlines()
    if not lines:
        return "?"
    # 'openjdk version "17.0.15" 2025-04-15' -> 'Java 17.0.15 (openjdk)'
    parts = lines[0].split('"')
    return f"Java {parts[1]} ({parts[0].split()[0]})" if len(parts) >= 2 else lines[0]


def code_version() -> str:
    """The commit benchmarked and, if ``src/`` differs from it, a digest of the difference
    (read-only git calls), so a run during which the code changed can say so."""
    import hashlib
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--", "src").strip()
        diff = git("diff", "HEAD", "--", "src") if dirty else ""
    except OSError:
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    if not dirty:
        return f"commit {head}"
    digest = hashlib.sha256((dirty + diff).encode()).hexdigest()[:8]
    return f"commit {head} with uncommitted changes in src/ (digest {digest})"


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "?"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def write_json_rows(folder: str, index: int, rows: Sequence[tuple[str, int]]) -> None:
    """Add ``{"k": ..., "v": ...}`` lines as file ``<index>.json`` of a streaming source,
    atomically: written beside the folder, then renamed in, so Spark never sees it half
    written."""
    import json

    name = f"{index:05d}.json"
    tmp = os.path.join(os.path.dirname(folder.rstrip("/")), f".tmp-{name}")
    with open(tmp, "w") as handle:
        handle.write("\n".join(json.dumps({"k": k, "v": v}) for k, v in rows) + "\n")
    os.replace(tmp, os.path.join(folder, name))


@functools.cache
def polling_client() -> Any:
    """One ``httpx.Client`` for a benchmark's polls and side calls (a node coming up, a
    cluster settling, a metrics read): ``httpx.get`` builds a client per call and parses
    certifi's CA bundle each time (~35 ms of CPU), which a polling loop repeats. It keeps no
    connection alive, so each call opens its own, as ``httpx.get`` did."""
    import httpx

    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def start_python(args: Sequence[str], **options: Any) -> Any:
    """``subprocess.Popen(args, **options)`` for the Python processes a benchmark starts
    (``sparkiq serve`` nodes, observers). The benchmarks' smoke test replaces it with a
    starter that forks them from a process that imported sparkiq already
    (tests/forked_python.py): a smoke run's figures mean nothing, and its dozen node
    imports cost the test suite CPU. A benchmark calls it as ``_common.start_python``, so
    that the replacement reaches it."""
    import subprocess

    return subprocess.Popen(args, **options)
