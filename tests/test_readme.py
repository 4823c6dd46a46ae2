"""The README's quickstart runs as written, as a new user runs it: a fresh process whose
PATH python3 is not this virtual environment, and no PYSPARK_PYTHON."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart() -> str:
    text = README.read_text()
    section = text[text.index("## Quickstart") :]
    match = re.search(r"```python[^\n]*\n(.*?)```", section, re.S)  # "python no-run: ..." too
    assert match, "the README has a python quickstart"
    return match.group(1)


def test_quickstart_is_short() -> None:
    assert len(quickstart().strip().splitlines()) <= 20


def test_quickstart_runs_and_prints_what_it_promises(tmp_path: Path) -> None:
    code = quickstart().replace("/tmp/shop-state", str(tmp_path / "state"))
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "{'product': 'p-17', 'revenue': 123.0}"
    assert lines[1].startswith("[{'product': 'p-17', 'revenue': 123.0}] Position(")
    assert lines[2] == "[{'product': 'p-17', 'revenue': 123.0}]"
