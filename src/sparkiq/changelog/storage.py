"""Where the changelog lives: a local directory or any filesystem pyarrow can open.

``state_dir`` is a plain path (``/data/sparkiq``) or a URI (``s3://bucket/prefix``,
``gs://...``, ``hdfs://...``, ``abfs://...``, ``file:///...``). All changelog I/O goes
through :class:`Storage`, which resolves it once and offers the few operations the changelog
needs: atomic whole-file writes, whole-file reads, existence checks and listings.

Atomicity: :meth:`Storage.write_atomic` writes a temporary sibling and moves it into place,
so a reader never sees a half-written file under the final name. On object stores a single
PUT is already atomic and the move is a copy; on local disks and HDFS it is a rename.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs

from sparkiq.errors import ChangelogError, ConfigError

__all__ = ["Storage", "open_storage"]


@dataclass(frozen=True)
class Storage:
    """A resolved ``state_dir``: a pyarrow filesystem and the root path inside it."""

    uri: str
    fs: pafs.FileSystem
    root: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        return "/".join((self.root.rstrip("/"), *parts))

    def exists(self, path: str) -> bool:
        if self.is_local:
            return os.path.exists(path)
        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def read_bytes(self, path: str) -> bytes:
        try:
            if self.is_local:
                with open(path, "rb") as handle:
                    return handle.read()
            with self.fs.open_input_stream(path) as stream:
                return bytes(stream.read())
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
                raise FileNotFoundError(path) from exc
            raise ChangelogError(f"cannot read {path!r}: {exc}") from exc

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` so readers see either nothing or the whole file."""
        parent = path.rsplit("/", 1)[0]
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{path.rsplit('/', 1)[1]}"
        try:
            if self.is_local:
                os.makedirs(parent, exist_ok=True)
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
                return
            self.fs.create_dir(parent, recursive=True)
            with self.fs.open_output_stream(tmp) as stream:
                stream.write(data)
            self.fs.move(tmp, path)
        except OSError as exc:
            raise ChangelogError(f"cannot write {path!r}: {exc}") from exc

    def makedirs(self, path: str) -> None:
        if self.is_local:
            os.makedirs(path, exist_ok=True)
        else:
            self.fs.create_dir(path, recursive=True)

    def list_names(self, path: str) -> list[str]:
        """Names (not paths) of the entries of a directory; empty if it does not exist."""
        if self.is_local:
            try:
                return os.listdir(path)
            except FileNotFoundError:
                return []
        selector = pafs.FileSelector(path, allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]

    def delete(self, path: str) -> None:
        try:
            if self.is_local:
                os.remove(path)
            else:
                self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def delete_dir(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(path)


@functools.lru_cache(maxsize=64)
def open_storage(state_dir: str) -> Storage:
    """Resolve ``state_dir`` (a path or URI) once per process.

    Raises :class:`~sparkiq.errors.ConfigError` when pyarrow cannot open it, naming the
    value and the reason (e.g. an unknown scheme or missing credentials).
    """
    if not isinstance(state_dir, str) or not state_dir.strip():
        raise ConfigError(f"state_dir must be a non-empty path or URI, got {state_dir!r}")
    if "://" not in state_dir:
        root = os.path.abspath(os.path.expanduser(state_dir))
        return Storage(root, pafs.LocalFileSystem(), root)
    try:
        fs, root = pafs.FileSystem.from_uri(state_dir)
    except (ValueError, OSError) as exc:
        raise ConfigError(
            f"cannot open state_dir {state_dir!r}: {exc}. Use a local path or a URI pyarrow "
            "supports (file://, s3://, gs://, hdfs://, abfs://) with credentials configured."
        ) from exc
    if isinstance(fs, pafs.LocalFileSystem):
        return Storage(root, fs, root)
    return Storage(state_dir, fs, root)
