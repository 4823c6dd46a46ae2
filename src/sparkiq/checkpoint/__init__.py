"""Reading a Spark Structured Streaming checkpoint's state in place.

Layer: above :mod:`sparkiq.changelog`, below :mod:`sparkiq.wire`. Modules:

- :mod:`~sparkiq.checkpoint.layout` -- :class:`Checkpoint`: batches, operators, stores
- :mod:`~sparkiq.checkpoint.logs` -- the offset and commit logs
- :mod:`~sparkiq.checkpoint.provider` -- :class:`StateStoreInfo`, the ``StateFiles``
  protocol every provider's reader implements, decoding and replay
- :mod:`~sparkiq.checkpoint.hdfs` -- the HDFS-backed provider's ``N.delta``/``N.snapshot``
- :mod:`~sparkiq.checkpoint.rocksdb` -- the RocksDB provider's changelogs and ``N.zip``
  snapshots of one store, raw rows framed as the provider keeps them
- :mod:`~sparkiq.checkpoint.rocksdb_stores` -- a RocksDB-provider store opened from its
  description (the provider's ``open_state_files``), and the committed attempt's files
- :mod:`~sparkiq.checkpoint.framing` -- the RocksDB provider's row framing (prefix-scan keys,
  list values, version bytes, Avro schema ids) turned into UnsafeRow bytes
- :mod:`~sparkiq.checkpoint.avro` -- Spark's Avro state rows to UnsafeRow bytes
- :mod:`~sparkiq.checkpoint.tws` -- transformWithState variables (value, list, map state) as
  tables, and the v3 state schema file
- :mod:`~sparkiq.checkpoint.compression` -- Spark's codec stream framings
- :mod:`~sparkiq.checkpoint.files` -- checksum files (Hadoop's and Spark 4.1+'s)
- :mod:`~sparkiq.checkpoint.unsaferow` -- UnsafeRow bytes to Python values (PySpark's or
  sparkiq's internal form), and rows split and joined at the byte level
- :mod:`~sparkiq.checkpoint.convert` -- a store's UnsafeRows straight to sparkiq's encoded
  keys and rows (the replicas' hot path)
- :mod:`~sparkiq.checkpoint.source` -- the checkpoint's stores as sparkiq tables (changelog
  sources), with the running batch's files read ahead of its commit
"""

from __future__ import annotations

from sparkiq.checkpoint.layout import Checkpoint
from sparkiq.checkpoint.provider import (
    RowDecoder,
    StateFiles,
    StateStoreInfo,
    batch_of_version,
    replay,
    version_of_batch,
)

__all__ = [
    "Checkpoint",
    "RowDecoder",
    "StateFiles",
    "StateStoreInfo",
    "batch_of_version",
    "replay",
    "version_of_batch",
]
