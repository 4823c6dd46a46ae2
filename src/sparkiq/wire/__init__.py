"""Encodings on the wire: the binary protocol between nodes and the JSON of the REST API.

* :mod:`~sparkiq.wire.values` -- MessagePack for Python values as sparkiq returns them
  (datetimes, dates, decimals and tuples keep their types; Arrow tables travel as IPC).
* :mod:`~sparkiq.wire.protocol` -- requests and streamed per-partition results between a
  router and the node that hosts a partition, or a :class:`~sparkiq.Client` and any node.
* :mod:`~sparkiq.wire.jsonapi` -- JSON for people and tools: keys parsed by column type,
  rows rendered with ISO dates, requests validated field by field.
* :mod:`~sparkiq.wire.arrowipc` -- SQL results as Arrow IPC streams (``POST /query`` with
  ``Accept: application/vnd.apache.arrow.stream``), each column with its Spark type.
"""

from __future__ import annotations

from sparkiq.wire.protocol import (
    CONTENT_TYPE,
    PROTOCOL_VERSION,
    decode_request,
    encode_request,
    read_frames,
    result_frames,
    results_from_frames,
)
from sparkiq.wire.values import pack, unpack

__all__ = [
    "CONTENT_TYPE",
    "PROTOCOL_VERSION",
    "decode_request",
    "encode_request",
    "pack",
    "read_frames",
    "result_frames",
    "results_from_frames",
    "unpack",
]
