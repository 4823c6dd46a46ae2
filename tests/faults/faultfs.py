"""A changelog filesystem that fails, throttles or writes partially, on demand.

:class:`FaultyFileSystem` is a pyarrow ``FileSystemHandler`` over the local filesystem. What
it does wrong is read from a small JSON control file (see :class:`Faults`), re-read when it
changes, so a test flips faults on and off in other processes (``sparkiq serve`` nodes, the
writer) while they run. Behind ``pyarrow.fs.PyFileSystem`` it is a filesystem like S3's for
:class:`~sparkiq.changelog.Storage`: the non-local code path (streams, ``move``) is the one
exercised.

An injected failure is an ``OSError`` whose text never says "not found", so it is never
mistaken for a missing file (which the changelog treats as "not committed yet").
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from sparkiq.changelog import Storage, open_storage


@dataclass(frozen=True)
class Faults:
    """Probabilities (0..1) per call, and a delay per call in seconds."""

    fail_reads: float = 0.0  # opening a file to read raises
    fail_lists: float = 0.0  # listing a directory / stat raises
    fail_writes: float = 0.0  # opening a file to write raises
    partial_writes: float = 0.0  # a write stores the first half, then raises
    delay: float = 0.0  # every call sleeps this long first (a throttled store)

    def write(self, path: str) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump(asdict(self), handle)
        os.replace(tmp, path)


class InjectedFault(OSError):
    """A failure the harness injected (not a bug in the code under test)."""


class _Control:
    """The faults in force, re-read from the control file at most every 50 ms."""

    def __init__(self, path: str, seed: int) -> None:
        self.path = path
        self.rng = random.Random(seed)
        self.faults = Faults()
        self._checked = 0.0
        self._mtime = -1.0
        self._lock = threading.Lock()  # guards rng, faults and the two timestamps

    def current(self) -> Faults:
        with self._lock:
            now = time.monotonic()
            if now - self._checked > 0.05:
                self._checked = now
                try:
                    mtime = os.stat(self.path).st_mtime
                    if mtime != self._mtime:
                        with open(self.path) as handle:
                            self.faults = Faults(**json.load(handle))
                        self._mtime = mtime
                except (OSError, ValueError):
                    self.faults = Faults()
            return self.faults

    def roll(self, probability: float) -> bool:
        with self._lock:
            return probability > 0 and self.rng.random() < probability


class _HalfWriter:
    """A file object that stores half of what it is given, then fails (a torn upload)."""

    def __init__(self, path: str) -> None:
        self._handle = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.closed = False

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._handle.write(chunk[: len(chunk) // 2])
        self._handle.flush()
        raise InjectedFault(f"injected partial write: {len(chunk) // 2} of {len(chunk)} bytes")

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self.closed = True
        self._handle.close()


class FaultyFileSystem(pafs.FileSystemHandler):
    """The local filesystem, with the faults the control file names."""

    def __init__(self, control_path: str, seed: int = 0) -> None:
        self.base = pafs.LocalFileSystem()
        self.control = _Control(control_path, seed)

    def _enter(self, kind: str, path: str) -> Faults:
        faults = self.control.current()
        if faults.delay > 0:
            time.sleep(faults.delay)
        probability = {
            "read": faults.fail_reads,
            "list": faults.fail_lists,
            "write": faults.fail_writes,
        }[kind]
        if self.control.roll(probability):
            raise InjectedFault(f"injected {kind} failure on {path}")
        return faults

    # -- the FileSystemHandler interface -------------------------------------------------------

    def get_type_name(self) -> str:
        return "faulty-local"

    def equals(self, other: Any) -> bool:
        return other is self

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self._enter("list", paths[0] if paths else "")
        return self.base.get_file_info(paths)  # type: ignore[no-any-return]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self._enter("list", selector.base_dir)
        return self.base.get_file_info(selector)  # type: ignore[no-any-return]

    def create_dir(self, path: str, recursive: bool) -> None:
        self.base.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.base.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.base.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise InjectedFault("refusing to delete the root")

    def delete_file(self, path: str) -> None:
        self.base.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._enter("write", dest)
        self.base.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.base.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self._enter("read", path)
        return self.base.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        self._enter("read", path)
        return self.base.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        faults = self._enter("write", path)
        if self.control.roll(faults.partial_writes):
            return pa.PythonFile(_HalfWriter(path), mode="w")
        return self.base.open_output_stream(path)

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise InjectedFault("append is not used by the changelog")


def faulty_storage(state_dir: str, control_path: str, seed: int = 0) -> Storage:
    """A :class:`Storage` of the local ``state_dir`` through :class:`FaultyFileSystem`."""
    root = os.path.abspath(state_dir)
    fs = pafs.PyFileSystem(FaultyFileSystem(control_path, seed))
    return Storage(root, fs, root)


def install(state_dir: str, control_path: str, seed: int = 0) -> None:
    """Make every later ``open_storage(state_dir)`` of this process return the faulty storage.

    ``open_storage`` is cached per ``state_dir`` and every module takes its storage from it,
    so the cached instance is swapped in place (it is a frozen dataclass: hence
    ``object.__setattr__``). Call it before the node starts, with the state_dir string the
    node is given.
    """
    storage = open_storage(state_dir)
    object.__setattr__(storage, "fs", faulty_storage(state_dir, control_path, seed).fs)
