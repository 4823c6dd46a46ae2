"""The Spark side: the App, the table sink, the data source. The only package that imports
pyspark (the data source module imports it at once, so it is imported only when used)."""

from typing import Any

from sparkiq.spark.app import App, Table
from sparkiq.spark.lookup import enrich

__all__ = ["App", "Table", "enrich", "register_data_source"]


def register_data_source(spark: Any) -> None:
    """Make ``spark.read.format("sparkiq")`` and ``spark.readStream.format("sparkiq")``
    available in the session ``spark`` (classic or Spark Connect); see
    :mod:`sparkiq.spark.datasource`. :meth:`App.start` does it for the App's own session."""
    from sparkiq.spark.datasource import register_data_source as register

    register(spark)
