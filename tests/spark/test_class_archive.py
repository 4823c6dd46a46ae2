"""The class archive every Spark JVM of the tests maps (tests/spark/class_archive.py) is one
the JVM accepts: a stale or mismatched archive is silently ignored by design, so without
this test the suite could lose its speed-up unnoticed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyspark
import pytest

from tests.spark.class_archive import ARCHIVE, archive_options
from tests.spark.short_jvm import BASE_OPTIONS


def test_spark_submit_maps_the_archive_the_tests_use() -> None:
    if not ARCHIVE.is_file():
        pytest.skip(f"no class archive at {ARCHIVE}: `make test` builds it")
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    # -Xshare:on makes an archive the JVM cannot map an error instead of a silent fallback
    options = f"{BASE_OPTIONS} {archive_options()} -Xshare:on"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": options}
    done = subprocess.run(
        [str(spark_submit), "--version"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"the JVM refused {ARCHIVE}: {done.stderr[-2000:]}"
    assert "version" in done.stderr + done.stdout
