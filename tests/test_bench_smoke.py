"""Every benchmark in ``bench/`` still runs: ``make bench`` cannot break unnoticed.

Each module of ``bench/`` is imported, ``bench.run_all`` must list every benchmark module,
and each benchmark runs in its smallest form (``Scale.SMOKE``: tiny data, one round). No
figure is asserted (smoke runs are too small to mean anything, and the machine is shared);
what is checked is the report's structure: the rows each benchmark produces when every one
of its paths ran, so a benchmark that quietly skips a path fails here too.

The benchmarks that run on Spark take the test session's SparkSession (``spark=``) instead
of starting a JVM. Two run only in part, named in :data:`NOT_RUN` with the reason.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import pkgutil
import time
from pathlib import Path
from typing import Any

import bench
import pytest
from bench import _common, follower_tail, run_all, soak
from bench._common import Report, Scale

from tests import forked_python

#: Every module of bench/, helpers included.
MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__))
#: The modules that are benchmarks (a ``run`` producing a Report), not helpers or the runner.
BENCHMARK_MODULES = [m for m in MODULES if not m.startswith("_") and m != "run_all"]
EVERY = run_all.BENCHMARKS | run_all.ON_REQUEST

#: Benchmarks whose smallest form is not run here, and why. What of them runs without a new
#: JVM or a minute of wall time is tested below.
NOT_RUN = {
    "sink_connect": "each run is a child process with a Spark of its own (a classic local "
    "JVM; a Spark Connect server's JVM): two new JVMs; its classic runs are bench.sink's "
    "code, smoke-run here on the test session",
    "soak": "a fault cycle takes a minute (three `sparkiq serve` nodes, a writer, client "
    "load); its sampling, fault, resource and memory tables are tested without the cluster",
}

#: Rows of each benchmark's report when every path ran (methods x phases, setups...).
ROWS = {
    "lookup": 9,  # 3 phases (memtable, flushed, composite key) x (floor, node.get, KeyQuery)
    "http": 3,  # floor, GET, SQL
    "failover": 1,  # one round
    "membership": 1,  # one cluster size (its changes and the process check in more_tables)
    "membership_gossip": 1,  # one cluster size (its changes in more_tables)
    "membership_processes": 1,  # one size: processes and in-process (changes in more_tables)
    "sql_scan": 21,  # 3 queries x 5 methods, RocksDB to Arrow, 2 key lookups, 3 join rows
    "versions": 18,  # apply (3 + 3 per CPU-second), 2 gets, 2 memory, 3 aggregates, 5 reads
    "pgwire": 3,
    "arrow": 7,
    "flight": 4,  # floor, Flight SQL, Postgres, REST Arrow
    "push": 8,
    "apply": 5,
    "restore": 6,
    # the commit write, then a row per reader: follow, its subset, follow at the Node's
    # poll interval (when its default differs), a Node
    "follower_tail": 1 + len(follower_tail._readers()[0]),
    "statestore": 2,
    "checkpoint_decode": 3,
    # baseline, the default, without its local node, tasks in place, tasks shuffled, and
    # each difference (the phase table in more_tables)
    "sink": 9,
    "attach": 3,
    "freshness": 5,
    "ryw_latency": 3,  # the micro-batch floor, the bounded read, the unbounded read
    "realtime": 4,  # the broker's round trip, real-time mode, micro-batches, their duration
    "fuzz": 3,
}

SPARK = sorted(n for n, run in EVERY.items() if run_all.uses_spark(run))
NO_SPARK = sorted(n for n in EVERY if n not in SPARK and n not in NOT_RUN)


@pytest.fixture(autouse=True)
def forked_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes and observers a smoke run starts are forked from a process that imported
    sparkiq already (tests/forked_python.py): what a smoke run checks is the report's
    shape, not a process's start."""
    monkeypatch.setattr(_common, "start_python", forked_python.popen)


def test_every_bench_module_imports() -> None:
    failed = {}
    for name in MODULES:
        try:
            importlib.import_module(f"bench.{name}")
        except Exception as exc:  # every broken module at once, not only the first
            failed[name] = f"{type(exc).__name__}: {exc}"
    assert failed == {}
    assert "versions" in MODULES and "_common" in MODULES  # the listing found bench/


def test_run_all_runs_every_benchmark_module() -> None:
    assert sorted(EVERY) == BENCHMARK_MODULES
    for name, run in EVERY.items():
        assert run.__module__ == f"bench.{name}"
    assert set(ROWS) | set(NOT_RUN) == set(EVERY)


def test_spark_benchmarks_are_the_expected_ones() -> None:
    """A benchmark that starts Spark takes ``spark=``: run_all then stops the session, and
    the smoke test passes it the test session rather than a JVM of its own."""
    assert SPARK == [
        "attach",
        "checkpoint_decode",
        "freshness",
        "realtime",
        "ryw_latency",
        "sink",
        "statestore",
    ]


def test_run_all_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run_all.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--smoke" in out and "--quick" in out
    for name in EVERY:
        assert name in out


@pytest.mark.parametrize("name", sorted(EVERY))
def test_each_benchmark_takes_smoke(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"bench.{name}")
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    assert exited.value.code == 0
    assert "--smoke" in capsys.readouterr().out


def _check(report: Report, name: str) -> None:
    assert report.name == name
    assert report.scale is Scale.SMOKE
    assert len(report.rows) == ROWS[name], report.table()
    for row in report.rows:
        assert len(row) == len(report.columns), row
    assert report.readings, report.table()
    assert len(report.table().splitlines()) == len(report.rows) + 2


@pytest.mark.parametrize("name", NO_SPARK)
def test_smoke_run(name: str) -> None:
    report = EVERY[name](Scale.SMOKE)
    _check(report, name)
    if name == "lookup":  # the breakdown reads the node's insides; it says when they moved
        assert "breakdown_error" not in report.figures
        assert report.figures["breakdown_ns"]
    if name == "follower_tail":  # every reader ran, sparkiq.follow's subset included
        assert report.figures["follow_available"]
        assert "follow, where= + columns=" in report.figures["p50_ms"]


@pytest.mark.parametrize("name", SPARK)
def test_smoke_run_on_the_session(name: str, spark: Any) -> None:
    report = EVERY[name](Scale.SMOKE, spark=spark)
    _check(report, name)


def test_run_all_smoke(tmp_path: Path) -> None:
    """``run_all --smoke`` runs, saves its JSON and leaves docs/benchmarks.md alone."""
    docs = Path(run_all.DOCS) / "benchmarks.md"
    before = docs.stat().st_mtime_ns
    out = tmp_path / "figures.json"
    results = run_all.main(["--smoke", "--only", "restore", "--json", str(out)])
    assert results["failures"] == {}
    assert results["info"]["scale"] == "smoke"
    saved = json.loads(out.read_text())
    assert saved["restore"]["scale"] == "smoke"
    assert len(saved["restore"]["rows"]) == ROWS["restore"]
    assert docs.stat().st_mtime_ns == before
    with pytest.raises(SystemExit) as exited:
        run_all.main(["--smoke", "--write-docs", "--only", "restore"])
    assert exited.value.code == 2

    # The page a full run writes, built from a smoke report (a full run gets there only
    # after fifteen minutes).
    report = EVERY["restore"](Scale.SMOKE)
    page = run_all._docs([report], {"http": "RuntimeError: boom"}, results["info"])
    assert page.startswith("# Benchmarks\n")
    assert "(smoke run, " in page
    assert f"## {report.title}\n" in page and report.table() in page
    assert "- **http** - FAILED in this run: RuntimeError: boom" in page
    assert run_all.CONTEXT["restore"] in page


#: What run_all knows of a run, for building its page in a test.
_INFO: dict[str, Any] = {
    "date": "today",
    "scale": "smoke",
    "duration_s": 60.0,
    "code": "abc1234",
    "load_before": "0.1",
    "load_after": "0.2",
    "machine": collections.defaultdict(lambda: "-"),
}


def test_soak_reports_sampled_resources(tmp_path: Path) -> None:
    """The soak's sampling and resource table, on this process (no cluster)."""
    pid = os.getpid()
    samples = []
    for _ in range(3):
        taken = soak._sample(pid)
        assert taken is not None
        rss_mb, threads, fds = taken
        assert rss_mb > 0 and threads >= 1 and fds >= 3
        samples.append(soak.Sample(time.monotonic(), pid, rss_mb, threads, fds))
        time.sleep(0.01)
    (row,) = soak.resources({"n0": samples}, warmup=0.0)
    assert row[0] == "n0" and row[1] == "1"  # one incarnation
    assert len(row) == len(soak.RESOURCE_COLUMNS)
    # the detailed memory log: a row per window of the node's longest incarnation
    samples[1].parts = {"malloc_in_use": 30.0, "rocksdb": 10.0, "malloc_free_held": 5.0}
    (window,) = soak.memory_windows({"n0": samples}, window_s=60.0)
    assert window[:2] == ["n0", "0-1"] and window[3:6] == ["20.0", "10.0", "5.0"]
    assert float(window[2]) == pytest.approx(sum(s.rss_mb for s in samples) / 3, abs=0.06)
    assert len(window) == len(soak.WINDOW_COLUMNS)
    tally = soak.FaultTally(count=2, ops=1200, failed=3, worst_gap=0.5, worst_client_gap=1.25)
    assert soak.fault_rows({"kill -9": tally}) == [
        ["kill -9", "2", "3/1,200", "0.50 s", "1.25 s", "0.00 s", "0"]
    ]
    report = Report("soak", "Soak", "m", "b", "t", soak.FAULT_COLUMNS)
    report.rows = soak.fault_rows({"kill -9": tally})
    report.more_tables.append((soak.RESOURCE_COLUMNS, [row]))
    page = run_all._docs([report], {}, _INFO)
    assert report.table() + "\n\n| node " in page  # both tables, the faults first
    path = tmp_path / "samples.jsonl"
    soak.write_samples({"n0": samples}, str(path))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["pid"] for line in lines] == [pid] * 3
    assert soak.slope_per_hour([(0.0, 1.0), (3600.0, 3.0)]) == pytest.approx(2.0)


def test_a_full_run_keeps_the_sections_of_benchmarks_it_did_not_run(tmp_path: Path) -> None:
    """`make bench` rewrites docs/benchmarks.md; the soak (on request only, 30 minutes or
    more) keeps its section and summary line from the page it replaces."""
    old = tmp_path / "benchmarks.md"
    old.write_text(
        "# Benchmarks\n\n## Summary\n\n- **Lookups** - old\n- **Soak: faults** - 0 anomalies\n"
        "\n## Lookups\n\nModule: `bench/lookup.py`\n\nold table\n"
        "\n## Soak: faults\n\nModule: `bench/soak.py`\n\nthe soak's table\n"
    )
    kept = run_all._kept_sections(str(old), ["soak"])
    new = "# Benchmarks\n\n## Summary\n\n- **Lookups** - new\n\n## Lookups\n\nnew table\n"
    page = run_all._with_kept(new, kept)
    assert "- **Lookups** - new\n" in page and "old" not in page
    assert "- **Soak: faults** - 0 anomalies" in page
    assert page.endswith("## Soak: faults\n\nModule: `bench/soak.py`\n\nthe soak's table\n")
    assert run_all._with_kept(new, run_all._kept_sections(str(old), [])) == new


def test_a_sections_notes_survive_a_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What was learnt of a path (bench/notes/<name>.md) is written under its section by
    every run, after the figures and the section's context."""
    (tmp_path / "lookup.md").write_text("What is left: the key path.\n")
    monkeypatch.setattr(run_all, "NOTES", str(tmp_path))
    report = Report("lookup", "Lookups", "m", "b", "t", ["a"])
    page = run_all._docs([report], {}, _INFO)
    assert page.index(run_all.CONTEXT["lookup"]) < page.index("What is left: the key path.")
    other = run_all._docs([Report("http", "H", "m", "b", "t", ["a"])], {}, _INFO)
    assert "the key path." not in other
    monkeypatch.undo()
    for name in os.listdir(run_all.NOTES):  # every notes file belongs to a benchmark
        assert name.removesuffix(".md") in EVERY, name
