"""A small tmpfs to fill up: a real full disk under a store or a node's replicas (root only)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


def mount_tmpfs(path: Path, megabytes: int) -> str:
    """Mount a tmpfs of ``megabytes`` on ``path``; return why not ("" once mounted)."""
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if result.returncode == 0:
        return ""
    return f"mount -t tmpfs failed: {result.stderr.strip() or result.returncode}"


def unmount(path: Path | str) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(directory: Path) -> Path:
    """Take every free byte of the file system under ``directory``; delete the returned file
    to give them back.

    Unbuffered: a buffered file kept what the full disk refused and raised ENOSPC again when
    closed. ``fallocate`` takes most of it at once; the writes take what it left (when
    something else wrote between ``statvfs`` and ``fallocate`` and it failed).
    """
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        stat = os.statvfs(directory)
        with contextlib.suppress(OSError):
            os.posix_fallocate(handle.fileno(), 0, stat.f_bavail * stat.f_frsize)
        with contextlib.suppress(OSError):
            while handle.write(b"\0" * 65536):
                pass
    return filler
