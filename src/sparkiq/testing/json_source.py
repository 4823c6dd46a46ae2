"""A folder of JSON-lines files as a streaming source a test feeds one batch at a time."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

__all__ = ["JsonSource"]


class JsonSource:
    """A folder of JSON-lines files: a streaming source a test feeds one batch at a time.

    ``schema`` is a DDL string (``"k string, n long"``). Each :meth:`write` adds one file,
    written under a hidden name and renamed, so Spark never reads half a file; with
    :meth:`stream`'s default of one file per trigger, each write is one micro-batch.
    """

    def __init__(self, path: str | os.PathLike[str], schema: str) -> None:
        self.path = Path(path)
        self.schema = schema
        self.path.mkdir(parents=True, exist_ok=True)
        self._files = len(list(self.path.glob("*.json")))

    def stream(self, spark: Any, *, files_per_trigger: int = 1) -> Any:
        """The folder as a streaming DataFrame."""
        return (
            spark.readStream.schema(self.schema)
            .option("maxFilesPerTrigger", files_per_trigger)
            .json(str(self.path))
        )

    def batch(self, spark: Any) -> Any:
        """Every row written so far as a batch DataFrame: the input of a ground truth."""
        return spark.read.schema(self.schema).json(str(self.path))

    def write(self, rows: Iterable[Mapping[str, Any]]) -> Path:
        """Add ``rows`` (dicts of column values) as one new file and return its path.

        Dates and datetimes are written in ISO 8601 (naive datetimes are read in the
        session time zone), decimals as exact text and binary as base64.
        """
        lines = [json.dumps(dict(row), default=_json_value) for row in rows]
        name = f"{self._files:06d}.json"
        hidden = self.path / f".{name}.tmp"
        hidden.write_text("".join(line + "\n" for line in lines))
        final = self.path / name
        hidden.rename(final)
        self._files += 1
        return final

    def feed(self, app: Any, rows: Iterable[Mapping[str, Any]], timeout: float = 120.0) -> Path:
        """:meth:`write` the rows, then wait until ``app`` has processed them and its local
        replicas have applied every committed batch, so queries see them."""
        path = self.write(rows)
        app.process_all_available(timeout=timeout)
        return path


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"JsonSource cannot write a {type(value).__qualname__}")
