"""What the read-only handles on local replicas share: a follower
(:class:`~sparkiq.serving.follower.Follower`) and an attached checkpoint
(:class:`~sparkiq.serving.attach.Attached`).

Each holds a :class:`~sparkiq.serving.hosting.Hosting` of its own and, for RocksDB stores
without a ``local_dir``, a temporary directory that only it uses; closing the handle closes
the hosting and deletes that directory. Subclasses define :meth:`close` (what stops first
differs) and call :meth:`_release` from it.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Self

from sparkiq.serving.hosting import Hosting

__all__ = ["ReplicaHandle"]


class ReplicaHandle:
    """The lifecycle a read-only handle on local replicas shares with the others."""

    _hosting: Hosting
    _temporary: str | None = None

    def _local_dir(self, local_dir: str | None, store: str, prefix: str) -> str | None:
        """``local_dir``, or, for RocksDB stores given none, a new temporary directory that
        :meth:`_release` deletes."""
        if store == "rocksdb" and local_dir is None:
            local_dir = self._temporary = tempfile.mkdtemp(prefix=prefix)
        return local_dir

    def close(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Close the hosting (if it was built) and delete a temporary ``local_dir``."""
        hosting = getattr(self, "_hosting", None)
        if hosting is not None:
            hosting.close()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
