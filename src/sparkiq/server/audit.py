"""The audit log: who read what, one JSON line per request, in files of bounded size.

With ``audit_log`` (``--audit-log PATH``, ``SPARKIQ_AUDIT_LOG``) every authenticated request
a node answers -- REST, the node protocol's client requests, SQL over HTTP, push queries,
Postgres statements -- appends one line to ``PATH``::

    {"ts": "2026-11-28T07:10:00.123Z", "node": "n0", "listener": "http",
     "principal": "analyst", "peer": "10.0.0.7", "kind": "/query",
     "tables": ["revenue_by_product"], "rows": 12, "status": 200, "ms": 3.1}

``principal`` is null on a node that asks no credential; ``tables`` lists what the request
read (or asked for, when it was refused); ``rows`` is there when the answer's size is known
before it is streamed. The file rolls over at ``max_bytes`` and ``backups`` old files are
kept (``PATH.1`` ... ``PATH.<backups>``), so the log never holds more than
``(backups + 1) * max_bytes``. Requests between nodes (heartbeats, sub-requests) are not
logged: the node that took the caller's request logs it once.
"""

from __future__ import annotations

import datetime as dt
import logging
import logging.handlers
import threading
from collections.abc import Iterable
from typing import Any

import orjson

__all__ = ["AuditLog"]


class AuditLog:
    """Appends audit records to ``path`` (see the module docstring). Thread-safe (the
    logging handler serializes writes)."""

    def __init__(
        self, path: str, node_id: str, *, max_bytes: int = 16 << 20, backups: int = 4
    ) -> None:
        self.path = path
        self.node_id = node_id
        self._handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        # a logger of its own per log file, which nothing else writes to or propagates from
        self._log = logging.getLogger(f"sparkiq.audit.{id(self)}")
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        self._log.addHandler(self._handler)
        self._closed = threading.Event()

    def record(
        self,
        *,
        listener: str,
        principal: str | None,
        peer: str | None,
        kind: str,
        tables: Iterable[str],
        status: int | str,
        seconds: float,
        rows: int | None = None,
    ) -> None:
        if self._closed.is_set():
            return
        doc: dict[str, Any] = {
            "ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "node": self.node_id,
            "listener": listener,
            "principal": principal,
            "peer": peer,
            "kind": kind,
            "tables": sorted(set(tables)),
            "status": status,
            "ms": round(seconds * 1000, 3),
        }
        if rows is not None:
            doc["rows"] = rows
        self._log.info(orjson.dumps(doc).decode())

    def close(self) -> None:
        self._closed.set()
        self._log.removeHandler(self._handler)
        self._handler.close()
