"""The Spark side: the App, the table sink. The only package that imports pyspark."""

from sparkiq.spark.app import App, Table

__all__ = ["App", "Table"]
