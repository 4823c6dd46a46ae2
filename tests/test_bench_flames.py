"""``--flames``: a benchmark's measured phase drawn as a flame graph by py-spy, and linked
from its section of docs/benchmarks.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench import _flames, run_all
from bench._common import Report


@pytest.fixture
def flames_into(tmp_path: Path) -> Iterator[Path]:
    _flames.enable(tmp_path)
    yield tmp_path
    _flames.enable(None)


def _spin_for_the_sampler(seconds: float) -> int:
    """Python work that holds the interpreter lock, under a name to find in the graph."""
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n += sum(range(200))
    return n


def test_a_phase_is_drawn_with_its_own_functions(flames_into: Path) -> None:
    with _flames.flame("spin"):
        _spin_for_the_sampler(1.5)
    svg = (flames_into / "spin.svg").read_text()
    assert svg.startswith("<?xml") and "_spin_for_the_sampler" in svg
    assert "py-spy record" in svg and str(flames_into) not in svg  # no local paths kept


def test_flame_calls_loops_over_its_arguments(flames_into: Path) -> None:
    calls: list[int] = []
    _flames.flame_calls("calls", lambda n: calls.append(_spin_for_the_sampler(0.01)), [1, 2], 1.0)
    assert len(calls) >= 2 and len(calls) % 2 == 0
    assert "_spin_for_the_sampler" in (flames_into / "calls.svg").read_text()


def test_nothing_is_drawn_without_flames(tmp_path: Path) -> None:
    calls: list[int] = []
    with _flames.flame("off"):
        _flames.flame_calls("off", calls.append, [1], 1.0)
    assert calls == [] and not _flames.enabled()
    assert not (_flames.FLAMES / "off.svg").exists()


def test_a_section_links_its_benchmarks_flame_graphs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("lookup-get", "lookup-keyquery", "lookup_other", "http-get"):
        (tmp_path / f"{name}.svg").write_text("<svg/>")
    monkeypatch.setattr(_flames, "FLAMES", tmp_path)
    info = {
        "date": "d", "scale": "full", "duration_s": 60.0, "code": "c", "load_before": "l",
        "load_after": "l",
        "machine": dict.fromkeys(("cpu", "cores", "ram", "os", "python", "pyspark",
                                  "rocksdict", "pyarrow", "java"), "x"),
    }  # fmt: skip
    page = run_all._docs([Report("lookup", "Lookups", "m", "b", "t", ["a"])], {}, info)
    assert "[lookup-get](flames/lookup-get.svg), [lookup-keyquery](flames/" in page
    assert "http-get" not in page and "lookup_other" not in page
