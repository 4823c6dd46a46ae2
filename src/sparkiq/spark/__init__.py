"""The Spark side: the App, the table sink, the data source. The only package that imports
pyspark. Its names are imported when first used (see :mod:`sparkiq.exports`), so a process
that runs only :mod:`sparkiq.spark.worker_python` (every Python worker Spark starts, when it is
configured) does not load the App and everything it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkiq.exports import lazy_exports

_HOMES: dict[str, tuple[str, ...]] = {
    "sparkiq.spark.app": ("App", "Table"),
    "sparkiq.spark.lookup": ("enrich",),
}

__all__ = ["App", "Table", "enrich", "register_data_source"]

if TYPE_CHECKING:
    from sparkiq.spark.app import App, Table
    from sparkiq.spark.lookup import enrich

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


def register_data_source(spark: Any) -> None:
    """Make ``spark.read.format("sparkiq")`` and ``spark.readStream.format("sparkiq")``
    available in the session ``spark`` (classic or Spark Connect); see
    :mod:`sparkiq.spark.datasource`. :meth:`App.start` does it for the App's own session."""
    from sparkiq.spark.datasource import register_data_source as register

    register(spark)
