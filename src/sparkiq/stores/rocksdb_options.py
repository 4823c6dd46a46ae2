"""The RocksDB options of every store of the process: one block cache and one memtable budget
shared by all the stores a process opens, created when the first one opens.

Point lookups dominate, and one process hosts many partitions on a small machine: a bloom
filter per table, a hash index inside data blocks, LZ4, and bounded memory that
:func:`rocksdb_memory` reports (``/metrics`` shows it beside its bound).
"""

from __future__ import annotations

import threading

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DataBlockIndexType,
    DBCompressionType,
    DBRecoveryMode,
    Options,
    WriteBufferManager,
)

__all__ = ["BLOCK_CACHE_BYTES", "MEMTABLE_BUDGET_BYTES", "rocksdb_memory", "store_options"]

#: LRU block cache shared by every RocksDB store of the process (data, index, filters).
BLOCK_CACHE_BYTES = 32 << 20
#: Memory all memtables of the process may use before RocksDB flushes the largest.
MEMTABLE_BUDGET_BYTES = 64 << 20
_WRITE_BUFFER_BYTES = 8 << 20

_shared_lock = threading.Lock()
_shared: tuple[Cache, WriteBufferManager] | None = None


def _shared_resources() -> tuple[Cache, WriteBufferManager]:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = (
                Cache(BLOCK_CACHE_BYTES),
                WriteBufferManager(MEMTABLE_BUDGET_BYTES, False),
            )
        return _shared


def rocksdb_memory() -> dict[str, tuple[int, int]]:
    """Bytes used and the bound of the shared block cache and memtables, by part; empty
    before any store was opened."""
    with _shared_lock:
        shared = _shared
    if shared is None:
        return {}
    cache, write_buffers = shared
    return {
        "block_cache": (cache.get_usage(), BLOCK_CACHE_BYTES),
        "memtables": (write_buffers.get_usage(), MEMTABLE_BUDGET_BYTES),
    }


def store_options(create: bool) -> Options:
    cache, write_buffers = _shared_resources()
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_bloom_filter(10, False)  # full filter, ~1% false positives
    table.set_cache_index_and_filter_blocks(True)  # bounded by the shared cache
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_data_block_index_type(DataBlockIndexType.binary_and_hash())
    table.set_data_block_hash_ratio(0.75)

    options = Options(raw_mode=True)
    options.create_if_missing(create)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_manager(write_buffers)
    options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    options.set_compression_type(DBCompressionType.lz4())
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_max_background_jobs(2)
    options.set_max_open_files(256)  # many partitions share the process's descriptors
    # RocksDB opens table files on an open only when max_open_files is unbounded; its default
    # of 16 threads for that did nothing here but start: one thread halves the CPU of an open
    # (3.0 -> 1.5-2.0 ms), which a node pays for each partition it hosts.
    options.set_max_file_opening_threads(1)
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1 << 20)
    options.set_wal_recovery_mode(DBRecoveryMode.point_in_time())
    return options
