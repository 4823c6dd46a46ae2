"""The Spark side: the App, the table sink. The only package that imports pyspark."""

from sparkiq.spark.app import App, Table
from sparkiq.spark.lookup import enrich

__all__ = ["App", "Table", "enrich"]
