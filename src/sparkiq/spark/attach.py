"""``App.attach``: serve a running streaming query's state, found from the query object.

Works the same with classic PySpark and Spark Connect: it reads only the query's ``id``,
``name`` and ``lastProgress`` and the session's SQL configuration, never the JVM. A
``StreamingQuery`` does not say where its checkpoint is, so the location comes from, in
order: ``checkpoint=`` when given; else Spark's default
(``spark.sql.streaming.checkpointLocation``): ``<it>/<query name>``, or the sub-directory
whose ``metadata`` file records the query's id.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sparkiq.errors import ConfigError

__all__ = ["checkpoint_of"]

_DEFAULT_LOCATION = "spark.sql.streaming.checkpointLocation"


def checkpoint_of(spark: Any, query: Any, checkpoint: str | None = None) -> str:
    """The checkpoint location of ``query`` (see the module docstring); raises
    :class:`~sparkiq.errors.ConfigError` saying what to pass when it cannot be found, or when
    the query has no stateful operator (nothing to serve)."""
    if not _is_streaming_query(query):
        raise ConfigError(
            f"attach() needs a StreamingQuery (what writeStream...start() returns), got "
            f"{type(query).__name__}"
        )
    progress = query.lastProgress
    if progress is not None and not progress.get("stateOperators"):
        raise ConfigError(
            f"query {query.name or query.id} has no stateful operator (its progress lists no "
            "stateOperators): there is no state to serve; attach a query that aggregates, "
            "deduplicates or keeps state"
        )
    if checkpoint is not None:
        return checkpoint
    query_id = str(query.id)
    try:
        root = spark.conf.get(_DEFAULT_LOCATION, None)
    except Exception:  # Connect raises for an unset conf without a default on some versions
        root = None
    if root:
        local = str(root).removeprefix("file://").removeprefix("file:")
        candidates = [query.name] if query.name else []
        if os.path.isdir(local):
            candidates += sorted(os.listdir(local))
        for child in candidates:
            if _query_id(os.path.join(local, child)) == query_id:
                return os.path.join(local, child)
    raise ConfigError(
        f"cannot find the checkpoint of query {query.name or query_id}: a StreamingQuery does "
        "not expose its checkpointLocation; pass checkpoint= (the location given to "
        "writeStream.option('checkpointLocation', ...))"
    )


def _is_streaming_query(query: Any) -> bool:
    """Whether ``query`` is a classic or a Spark Connect ``StreamingQuery`` (or a subclass).

    Not ``hasattr(query, "lastProgress")``: a DataFrame answers any attribute with a Column
    (Connect's always, classic's for a column of that name). By class name, because the two
    ``StreamingQuery`` classes are unrelated and Connect's module needs Connect's packages."""
    return any(
        cls.__name__ == "StreamingQuery" and cls.__module__.startswith("pyspark.sql.")
        for cls in type(query).__mro__
    )


def _query_id(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, "metadata")) as handle:
            return str(json.loads(handle.readline())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
