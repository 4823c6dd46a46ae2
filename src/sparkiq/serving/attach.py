"""Attach: serve the live state of any Spark streaming query, read from its checkpoint.

Zero-change mode. A query with stateful operators (``groupBy().agg()``, windowed
aggregations, ``dropDuplicates``, ``transformWithState``...) already writes its state's
changelog into its checkpoint; :func:`attach` turns each state store into a read-only sparkiq
table (naming and columns: :mod:`sparkiq.checkpoint.source`) and keeps it current::

    counts = sparkiq.attach("/chk/clicks", name="clicks")
    counts.tables                        # ['clicks_agg']
    counts.get("clicks_agg", "user-7")   # {'user': 'user-7', 'count': 12}
    counts.sql("SELECT user, count FROM clicks_agg ORDER BY count DESC LIMIT 3")

Batch ids are the query's own: a batch is served once ``commits/<batch>`` exists. The handle
restores each partition from Spark's newest state snapshot plus the later changes, then
tails new versions in a background thread. It never writes, creates, locks or deletes
anything under the checkpoint, so the query neither knows nor pays for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sparkiq.checkpoint.source import CheckpointCatalog
from sparkiq.errors import ConfigError
from sparkiq.query.position import Position
from sparkiq.serving.config import NOT_GIVEN, NodeConfig, resolve_group
from sparkiq.serving.handle import QueryableHandle
from sparkiq.serving.hosting import Hosting
from sparkiq.serving.lookup import Lookup
from sparkiq.sql import SqlEngine, SqlLimits

__all__ = ["Attached", "attach", "check_outside", "checkpoint_items"]


def attach(
    checkpoint_uri: str,
    *,
    name: str,
    operators: Mapping[int, str] | Iterable[int] | None = None,
    local_dir: str | None = None,
    store: str = "rocksdb",
    poll_interval: float = 0.02,
    sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
    start: bool = True,
) -> Attached:
    """Serve the state stores of the checkpoint at ``checkpoint_uri``; see :class:`Attached`."""
    return Attached(
        checkpoint_uri,
        name=name,
        operators=operators,
        local_dir=local_dir,
        store=store,
        poll_interval=poll_interval,
        sql_limits=sql_limits,
        start=start,
    )


class Attached(QueryableHandle):
    """A read-only handle on the state of one Spark streaming query, from its checkpoint.

    - ``name``: the prefix of the table names (``<name>_<operator>[_<store>]``).
    - ``operators``: operator ids to attach (default: every stateful operator), or a mapping
      from operator id to the operator part of its tables' names.
    - ``local_dir``: where the replicas' RocksDB files live, never inside the checkpoint;
      by default a temporary directory deleted by :meth:`close`.
    - ``store``: ``"rocksdb"`` (default) or ``"memory"``; ``poll_interval``: seconds between
      checks for new commits; ``start=False`` opens the tables without tailing (call
      :meth:`poll_once`, or :meth:`start`).
    - ``sql_limits``: the limits of :meth:`sql` (a :class:`~sparkiq.sql.SqlLimits`, or a
      mapping of some of its fields), then ``SPARKIQ_SQL_<NAME>`` variables, as a node's.

    The same query methods as :class:`~sparkiq.Node`: :meth:`get`, :meth:`query`, :meth:`sql`,
    :meth:`status`, :meth:`position`. Thread-safe; :meth:`close` stops tailing and closes
    the stores (also as a context manager).
    """

    def __init__(
        self,
        checkpoint_uri: str,
        *,
        name: str,
        operators: Mapping[int, str] | Iterable[int] | None = None,
        local_dir: str | None = None,
        store: str = "rocksdb",
        poll_interval: float = 0.02,
        sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
        start: bool = True,
    ) -> None:
        NodeConfig.resolve(checkpoint_uri, environ={}, store=store, poll_interval=poll_interval)
        # the SQL limits of a node: keyword, then SPARKIQ_SQL_<NAME>, then defaults
        self._sql_limits: SqlLimits = resolve_group("sql_limits", sql_limits)
        if store == "memory" and local_dir is not None:
            raise ConfigError("local_dir is only used with store='rocksdb'")
        self.checkpoint_uri = checkpoint_uri
        self.name = name
        self.catalog = CheckpointCatalog(checkpoint_uri, name, operators)
        self.catalog.names()  # a wrong operator id or an unservable store fails here, clearly
        local_dir = self._local_dir(local_dir, store, prefix=f"sparkiq-attach-{name}-")
        self.local_dir = local_dir
        self._sql: SqlEngine | None = None
        self._closed = False
        try:
            if local_dir is not None:
                check_outside(checkpoint_uri, local_dir)
            self._hosting = Hosting(
                None,
                node_id=f"attach-{name}",
                placement=lambda _table, count: range(count),
                local_dir=local_dir,
                store=store,
                poll_interval=poll_interval,
                catalogs=[self.catalog],
            )
            self._lookup = Lookup(
                self._hosting, node_id=f"attach-{name}", sql_limits=self._sql_limits
            )
            self._hosting.refresh_tables()
        except BaseException:
            self._release()
            raise
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def poll_once(self) -> int:
        """Discover new stores and apply what was committed since the last poll, now."""
        self._require_open()
        self._hosting.refresh_tables()
        return self._hosting.poll_once()

    def close(self) -> None:
        """Stop tailing, close the stores and delete a temporary ``local_dir``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._release()

    def _closed_message(self) -> str:
        return f"the attached checkpoint {self.checkpoint_uri!r} is closed"

    # -- what it holds -----------------------------------------------------------------------

    def position(self, table: str) -> Position:
        self._require_open()
        return self._hosting.position(table)

    def wait_for(self, batch_id: int, timeout: float | None = None) -> bool:
        """Block until every attached table applied ``batch_id``; False on timeout or when a
        partition is stuck on an error (see :meth:`status`)."""
        self._require_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._hosting.tables:  # the query has not committed a stateful batch yet
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
            self._hosting.refresh_tables()
        for table in self._hosting.tables:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._hosting.wait_for(table, batch_id, remaining):
                return False
        return True

    def __repr__(self) -> str:
        return f"Attached({self.checkpoint_uri!r}, name={self.name!r}, tables={self.tables})"


def check_outside(checkpoint_uri: str, local_dir: str) -> None:
    """Refuse a ``local_dir`` inside the checkpoint: nothing is ever written there."""
    path = checkpoint_uri.removeprefix("file://").removeprefix("file:")
    if "://" in path:
        return
    root, mine = os.path.realpath(path), os.path.realpath(local_dir)
    if os.path.commonpath([root, mine]) == root:
        raise ConfigError(
            f"local_dir {local_dir!r} is inside the checkpoint {checkpoint_uri!r}: sparkiq "
            "never writes into a Spark checkpoint; choose a directory outside it"
        )


def checkpoint_items(items: Sequence[str]) -> dict[str, str]:
    """``--checkpoint NAME=URI`` items (empty ones skipped) as a dict; ValueError naming a
    bad one."""
    out: dict[str, str] = {}
    for item in items:
        if not item.strip():
            continue
        name, sep, uri = item.strip().partition("=")
        if not sep or not name or not uri:
            raise ValueError(
                f"--checkpoint {item!r}: expected NAME=URI, e.g. clicks=/data/checkpoints/clicks"
            )
        if name in out:
            raise ValueError(f"--checkpoint: the name {name!r} is given twice")
        out[name] = uri
    return out
