"""Flame graphs of a benchmark's measured phase: ``--flames`` on any benchmark.

A benchmark wraps the part it times in ``with flame("name"):`` (or ``flame("name",
pid=server.pid)`` when the code measured runs in a ``sparkiq serve`` process). With
``--flames`` (``python -m bench.lookup --flames``, ``python -m bench.run_all --flames``)
py-spy samples that process for that phase, run once more apart from the timed runs, and
writes ``docs/flames/<name>.svg`` (``--flames DIR``: into ``DIR``);
without it the context does nothing, so the figures of an ordinary run are not disturbed
by a sampler. ``bench.run_all`` links every flame graph a section's benchmark wrote from
that section of docs/benchmarks.md.

py-spy reads the process's memory from outside (no instrumentation in the interpreter):
what it shows is where the CPU time goes, not what the timers measure, and it costs the
process a little while it samples, so a run with flames is for reading, not for figures.
Only samples that hold the interpreter lock (``--gil``) are drawn: the Python work, not the
threads waiting on sockets or locks, which a busy benchmark process has many of.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FLAMES", "enable", "enabled", "flame", "flame_calls", "flames_of"]

#: Where flame graphs go, beside the page that links them.
FLAMES = Path(__file__).resolve().parent.parent / "docs" / "flames"
#: Samples a second: enough for a phase of a few seconds to show functions of 1%.
RATE = 250

#: Where this run draws its flame graphs; None: it draws none (no ``--flames``).
_folder: Path | None = None


def enable(folder: str | Path | None) -> None:
    """Make :func:`flame` record into ``folder`` (``--flames [DIR]``), or stop (None);
    refused when py-spy is not installed."""
    global _folder
    if folder is not None and _py_spy() is None:
        raise SystemExit(
            "--flames needs py-spy (in the dev extra: make test installs it; else "
            ".venv/bin/pip install py-spy): it samples the process from outside"
        )
    _folder = None if folder is None else Path(folder)


def enabled() -> bool:
    """Whether this run draws flame graphs: a benchmark adds its extra passes only then."""
    return _folder is not None


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def flame(name: str, pid: int | None = None, *, native: bool = False) -> Iterator[None]:
    """Sample process ``pid`` (this one by default) while the block runs, into
    ``docs/flames/<name>.svg``; nothing unless :func:`enable` was called.

    ``native``: a path whose cost is largely in compiled code (RocksDB's write, Arrow
    kernels) is drawn with its native frames, from every sample of its busy threads: py-spy
    must then pause the process for each sample, and tell apart no interpreter lock."""
    if _folder is None:
        yield
        return
    _folder.mkdir(parents=True, exist_ok=True)
    out = _folder / f"{name}.svg"
    command = [str(_py_spy()), "record", "--pid", str(pid or os.getpid()), "--rate", str(RATE)]
    # --function: a function's samples in one box, not one box per line of it
    command += ["--native"] if native else ["--gil", "--nonblocking"]
    command += ["--function", "--format", "flamegraph"]
    command += ["--output", str(out)]
    sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # py-spy needs a moment to attach; a phase that started before it would lose its head.
    time.sleep(0.5)
    try:
        yield
    finally:
        # SIGINT is py-spy's "stop and write the file"; its stderr says why if it could not.
        sampler.send_signal(signal.SIGINT)
        try:
            _, err = sampler.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            sampler.kill()
            err = b"py-spy did not finish writing in 120 s"
        if not out.exists():
            print(f"flame graph {name}: not written: {err.decode(errors='replace')[-500:]}")
        else:
            _without_local_paths(out)
            print(f"flame graph {name}: {out}")


def _without_local_paths(svg: Path) -> None:
    """py-spy writes its command line into the graph: the checkout's absolute paths become
    relative ones (the repository is cloned anywhere), py-spy's own path its bare name."""
    text = re.sub(r"\S*/py-spy record", "py-spy record", svg.read_text())
    text = re.sub(r"--output \S+", f"--output docs/flames/{svg.name}", text)
    svg.write_text(text.replace(str(FLAMES.parent.parent) + "/", ""))


def flame_calls(
    name: str, fn: Callable[[Any], Any], args: Sequence[Any], seconds: float = 4.0
) -> None:
    """Call ``fn`` over ``args`` again and again for ``seconds`` under :func:`flame`: an
    in-process path's own pass, apart from the timed ones (nothing when not enabled)."""
    if _folder is None:
        return
    with flame(name):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for arg in args:
                fn(arg)


def flames_of(benchmark: str) -> list[Path]:
    """The flame graphs a benchmark wrote (``<benchmark>.svg``, ``<benchmark>-*.svg``)."""
    if not FLAMES.is_dir():
        return []
    return sorted(p for p in FLAMES.glob(f"{benchmark}*.svg") if p.stem.split("-")[0] == benchmark)
