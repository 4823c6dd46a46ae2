"""Waiting, on the event loop, for a producer's Kafka records to be read by a table.

A producer reading its own write (``"after"`` in a request, see
:mod:`sparkiq.serving.source_bounds`) usually arrives before the micro-batch that reads its
record. The read cannot be answered until the writer commits that batch; a pool thread held
for that wait would be one fewer to answer everyone else, so the server waits here instead,
on its event loop, asking the node's memory of recent commits (no I/O) every few
milliseconds. The request then runs as any other, and answers ``NOT_UP_TO_BOUND`` if the
writer still has not committed the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from sparkiq.query.position import PositionBound
from sparkiq.server.served import ServedNode

__all__ = ["until_sources_read"]

# How often a waiting request looks again: a few ms against a micro-batch of a second.
_RECHECK = 0.01


async def until_sources_read(node: ServedNode, tables: Iterable[str], bound: PositionBound) -> None:
    """Return once every one of ``tables`` has, as far as ``node`` has seen, committed the
    Kafka records ``bound`` asks for, or after ``node.source_wait`` seconds."""
    if bound.is_unbounded:
        return
    tables = tuple(tables)
    if all(node.sources_read(t, bound) for t in tables):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + node.source_wait
    while loop.time() < deadline:
        await asyncio.sleep(_RECHECK)
        if all(node.sources_read(t, bound) for t in tables):
            return
