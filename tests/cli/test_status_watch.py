"""``sparkiq status --watch``: redrawn in place on a terminal, one block per update when
piped."""

from __future__ import annotations

import shlex
import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.changelog.helpers import make_table, write_batch
from tests.cli.processes import start_cli
from tests.cli.terminal import Terminal


def test_watch_without_a_terminal_prints_one_block_per_update(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1})
    command = ["status", "--state-dir", str(tmp_path), "--watch", "0.2"]
    process = start_cli(command)
    try:
        assert process.stdout is not None
        newest = []
        while "1" not in newest:
            line = process.stdout.readline()
            assert line, "the watch ended by itself"
            if line.startswith("t "):
                newest.append(line.split()[4])
                if len(newest) == 2:
                    write_batch(changelog, 1, {"b": 2})  # a later block shows it
        assert newest[:2] == ["0", "0"]
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run)")
def test_watch_on_a_terminal_redraws_in_place(tmp_path: Path, terminal: Terminal) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1})
    command = f"{shlex.quote(sys.executable)} -m sparkiq.cli status --watch 0.2"
    terminal.start(command, {"SPARKIQ_STATE_DIR": str(tmp_path)})
    terminal.wait_for(lambda s: "Ctrl-C stops" in s)
    write_batch(changelog, 1, {"b": 2})
    write_batch(changelog, 2, {"c": 3})

    def newest_is_2(screen: str) -> bool:
        rows = [line.split()[:5] for line in screen.splitlines()]
        return ["t", "2", "k", "0..2", "2"] in rows

    screen = terminal.wait_for(newest_is_2)
    # many updates later, the report is on the screen once: redrawn, not scrolled
    assert screen.count("batches kept") == 1
    assert screen.count("Ctrl-C stops") == 1
    terminal.keys("C-c")
    screen = terminal.wait_for(lambda s: "EXIT=" in s)
    assert "EXIT=0" in screen and "Traceback" not in screen
