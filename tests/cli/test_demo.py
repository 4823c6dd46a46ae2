"""``sparkiq demo`` on a terminal: redrawn in place, ``--duration`` ends it, cleanly.

The demo with its output piped (the console's URL first, a taken port, Spark's log in its
file and not on the screen, live values, Ctrl-C) is checked on the demo the docs' samples
run against, the last test of tests/docs/test_docs_blocks.py: each demo is a Spark JVM of
its own."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.cli.terminal import Terminal

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run)")
def test_demo_on_a_terminal_redraws_in_place_and_stops_by_itself_after_its_duration(
    tmp_path: Path, terminal: Terminal
) -> None:
    state = tmp_path / "demo-state"
    # --duration counts from the tables' first answer; the panel is redrawn every second
    # from Spark's start on (waiting, then the tables), so the screen has seen many redraws
    # whatever the machine's speed. A micro-batch every 3 s (--trigger): the summary needs
    # one, and the stop waits for a pause between two.
    command = (
        f"{shlex.quote(sys.executable)} -m sparkiq.cli demo --state-dir {shlex.quote(str(state))}"
        " --listen 127.0.0.1:0 --rate 50 --partitions 2 --trigger 3 --duration 3"
    )
    terminal.start(command, {})
    screen = terminal.wait_for(lambda s: "EXIT=" in s, timeout=300)
    assert "EXIT=0" in screen, screen
    assert screen.splitlines()[0].startswith("sparkiq console: http://127.0.0.1:")
    assert "was taken" not in screen  # port 0 asks for any free port: none was taken
    # the last summary is on the screen once, where the first "waiting" was: redrawn, not
    # scrolled
    summaries = [line for line in screen.splitlines() if line.startswith(" revenue_by_product ")]
    assert len(summaries) == 1, screen
    assert screen.count("Ctrl-C stops") == 1
    assert "waiting for the first micro-batch" not in screen
    assert "stopping...\nstopped." in screen
    for word in ("Traceback", "WARN", "ERROR", "KeyboardInterrupt"):
        assert word not in screen
