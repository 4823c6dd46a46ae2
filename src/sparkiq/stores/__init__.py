"""Partition stores: ordered ``bytes -> bytes`` maps with an atomic meta blob.

:class:`Store` and :class:`StoreIterator` state the contract (``base``); :class:`MemoryStore`
keeps a partition in a dict, :class:`RocksDBStore` in one RocksDB database per partition
directory. One contract suite (``tests/stores/test_store_contract.py``) runs against both.

Importing the package registers the handlers of the versioned key queries
(:mod:`~sparkiq.stores.versioned_queries`) beside the built-in ones of
:mod:`~sparkiq.stores.dispatch`, wherever a store answers queries.
"""

from __future__ import annotations

import sparkiq.stores.versioned_queries  # noqa: F401  (registers its handlers)
from sparkiq.stores.base import Store, StoreIterator
from sparkiq.stores.memory import MemoryStore
from sparkiq.stores.rocksdb import RocksDBStore

__all__ = ["MemoryStore", "RocksDBStore", "Store", "StoreIterator"]
