"""Running a Java JDBC probe of ``tests/server/jdbc/`` against a node: the driver's jars from
``.jvm/<module>/`` (``make jvm-jars``), Java's single-file launcher, the probe's JSON."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sparkiq.testing import kafka_jars_dir

PROBES = Path(__file__).parent / "jdbc"


def run_probe(
    module: str, jar_glob: str, probe: str, args: Sequence[str], java_options: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``java [java_options] -cp .jvm/<module>/* tests/server/jdbc/<probe> args...``."""
    jars = kafka_jars_dir() / module
    if not list(jars.glob(jar_glob)):
        pytest.fail(f"no {jar_glob} in {jars}: run `make jvm-jars`")
    java = shutil.which("java")
    assert java is not None, "the JDBC tests need a Java 17 runtime on PATH"
    command = [java, *java_options, "-cp", f"{jars}{os.sep}*", str(PROBES / probe), *args]
    # the launcher compiles the probe in memory first: seconds on a busy machine
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def records(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """A probe's result set (``columns`` and ``rows``) as one dict per row."""
    return [dict(zip(answer["columns"], row, strict=True)) for row in answer["rows"]]
