"""The ``sparkiq`` command as a subprocess whose output a test reads while it runs."""

from __future__ import annotations

import subprocess
import sys


def start_cli(command: list[str]) -> subprocess.Popen[str]:
    """``python -m sparkiq.cli *command``, started; stdout and stderr are text pipes."""
    return subprocess.Popen(
        [sys.executable, "-m", "sparkiq.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
