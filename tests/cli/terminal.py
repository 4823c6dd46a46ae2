"""A real terminal for the CLI's tests: tmux, driven by keys, read back as a screen."""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable


class Terminal:
    """A detached tmux session of its own server (its own socket): nothing is shared with
    any other tmux on the machine, and ``close`` ends only this server."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def start(self, command: str, env: dict[str, str]) -> None:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # the exit code stays on the screen after the shell ends
        line = f"env {exports} {command}; echo EXIT=$?; sleep 60"
        self.tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "50", line)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def type(self, text: str) -> None:
        # tmux reads an argument's final ';' as its command separator: send that one as hex
        body, semicolon = (text[:-1], True) if text.endswith(";") else (text, False)
        if body:
            self.tmux("send-keys", "-t", "t", "-l", body)
        if semicolon:
            self.tmux("send-keys", "-t", "t", "-H", "3b")

    def wait_for(self, check: Callable[[str], bool], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if check(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; the screen:\n{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
